"""One construct per unit GenNStack deploys (network, model storage, cluster, Karpenter, node pools,
controllers, serving, interruption handler, gateway, monitoring, spot drills) and the deploy-order
aspect. Manifests, values and policies are built by named functions that tests call on their own;
those that the command-line tools also read live in plain ``gennstack`` modules.
"""
