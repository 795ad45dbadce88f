"""botmesh kernel: dashboard."""
