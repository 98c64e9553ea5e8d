"""A Kubernetes double: the apiserver's REST and exec endpoints (:mod:`.apiserver`), a control plane
(:mod:`.cluster`) and a node that runs pods on the local Docker engine (:mod:`.node`)."""
