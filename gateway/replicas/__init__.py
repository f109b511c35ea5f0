"""Several engine replicas behind one ingress, on Ray Serve (the optional `loragate[ray]` extra).

The ingress is the ordinary app; its engine is a ReplicatedEngine that forwards each call
through a Ray Serve handle to EngineReplica deployments, naming the adapter as the
multiplexed model id so a replica that holds it serves it. Nothing here imports ray until
`--replicas` asks for it (availability.py), so the single-process server never needs it.
"""
