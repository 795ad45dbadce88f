"""botmesh kernel: coordination."""
