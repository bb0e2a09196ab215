"""The contract between the control plane (`api/`) and the trainer pods: one place, torch-free.

Both sides import these modules and nothing of it is copied:
- `spec`: the job spec (`POST /api/v1/jobs` body, the trainer's TRAINER_CONFIG), one set of
  bounds and field docs;
- `records`: the report records pods post to `POST /api/v1/jobs/{id}/reports`, typed by kind;
- `runtime`: where a pod runs, as the backends pass it in environment variables;
- `process`: exit codes, the log-line format the backends read reasons from, the umask;
- `checkpoints`: the layout of a job's checkpoint directory.

Nothing here may import torch: the API's supervisors and routes import it too.
"""
