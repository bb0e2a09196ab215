"""The Kubernetes backend: a job is an anchor ConfigMap, its pods, a coordinator and a
NetworkPolicy, observed through watches."""
