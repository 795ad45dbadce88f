"""botmesh kernel: channels."""
