"""Example placement plugins (docs: README, "Placement plugins")."""
