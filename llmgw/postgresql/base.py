"""Django's PostgreSQL backend with a pool of its own for heartbeats.

Every request waits for a connection from its process's pool (LLMGW_DB_POOL_SIZE) at most
LLMGW_DB_POOL_TIMEOUT, then is answered 503. An operator's burst (a dozen costly documents at once) could
take every connection of the pool for seconds, and the heartbeats behind it were answered 503 "database
not reachable". So a request on the heartbeat's path (llmgw.dependencies.heartbeat_lane, set by
llmgw.bodies) takes its connection from a second pool of LLMGW_DB_HEARTBEAT_POOL_SIZE connections that
nothing else uses. The same database and settings, the same transactions: only where the connection comes
from differs, and it goes back to the pool it came from.
"""

from __future__ import annotations

from django.conf import settings
from django.db.backends.postgresql import base

from llmgw.dependencies import heartbeat_lane


class DatabaseWrapper(base.DatabaseWrapper):
    @property
    def pool(self):
        pool = super().pool
        if pool is None or not heartbeat_lane.get():
            return pool
        key = f"{self.alias}:heartbeats"
        if key not in self._connection_pools:
            from psycopg_pool import ConnectionPool

            options = dict(self.settings_dict["OPTIONS"]["pool"])
            size = settings.LLMGW_DB_HEARTBEAT_POOL_SIZE
            options.update(max_size=size, min_size=min(options.get("min_size", 1), size))
            connect_kwargs = self.get_connection_params()
            connect_kwargs["autocommit"] = True  # as Django's own pool: it sets the mode later on
            heartbeats = ConnectionPool(
                kwargs=connect_kwargs,
                open=False,
                configure=self._configure_connection,
                check=ConnectionPool.check_connection if self.settings_dict["CONN_HEALTH_CHECKS"] else None,
                name="heartbeats",
                **options,
            )
            self._connection_pools.setdefault(key, heartbeats)
        return self._connection_pools[key]

    def close_pool(self):
        heartbeats = self._connection_pools.pop(f"{self.alias}:heartbeats", None)
        if heartbeats is not None:
            heartbeats.close()
        super().close_pool()
