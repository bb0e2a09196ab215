"""A job's detached supervisor: kubelet + pod controller of the local backend.

Run as `python -m api.backends.local.supervisor <job_dir>` (__main__.py). It starts the job's
coordinator (the torchft lighthouse of a live job, the rendezvous store of a restart job) and one
process group per pod with a stable ordinal, recreates a pod that failed (after a short backoff)
while the others carry on, restarts the coordinator if it dies, obeys the kill, scale, migrate
and delete commands dropped into `commands/`, and records everything in `state.json` (replaced
atomically) so that any API process can observe and re-adopt the job. Recovery inside the group
is the pods' business: live pods heal from a peer, restart pods are restarted by their torchrun
agents from the newest checkpoint. A live job's supervisor also keeps a warm standby
(api/backends/local/standby_process.py) that the next pod to start becomes, and tells the lighthouse
at once when a pod dies.

With `--adopt` it takes over from a supervisor that died, as a restarted kubelet re-adopts its
containers: the pods and coordinator listed in `state.json` that still run go on untouched.

One job per module: loop (the Supervisor: its pods, its ticks, its state document), adoption,
coordinator, commands, scaling, migration, failures (what an ended pod means, and when the job
gives up), keep_warm (when the standby runs), environment (what its processes inherit).
"""

from api.backends.local.supervisor.loop import Supervisor

__all__ = ["Supervisor"]
