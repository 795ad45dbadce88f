"""botmesh-admin: the operations control plane for chat bots (Django project and shared kernel)."""
