"""The simulator: a client program that drives many fake agents over the real heartbeat API."""
