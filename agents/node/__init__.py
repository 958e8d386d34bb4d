"""The software on each GPU node: the agent daemon, the replica runtime, agent.yaml, the sensors and the
heartbeat protocol. Imports no Django, Celery, psycopg or Channels, so a GPU node installs only what it needs."""
