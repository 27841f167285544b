"""Low-level Kubernetes pieces shared by every Kubernetes-facing module: kinds, client, metadata keys."""
