"""Stand-ins for hardware the tests cannot have (GPUs and their driver)."""
