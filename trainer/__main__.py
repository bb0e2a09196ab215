import logging
import os
import sys

from trainer.allocator import keep_freed_memory
from trainer.contract.process import PRIVATE_UMASK
from trainer.main import main

os.umask(PRIVATE_UMASK)  # checkpoints, the export, the tokenization cache, logs: private
keep_freed_memory(os.environ)  # process-wide: here, not in main(), which tests call in-process
code = main()
logging.shutdown()
sys.stdout.flush()
sys.stderr.flush()
# Everything is durable by now (checkpoints waited for, reports delivered or given up on).
# Skipping the interpreter's teardown skips tearing down the collective backends too: two
# gloo ranks doing that at the same moment were seen to abort ("terminate called without an
# active exception") after a successful run; exiting closes their connections anyway.
os._exit(code)
