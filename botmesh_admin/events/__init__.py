"""botmesh kernel: events."""
