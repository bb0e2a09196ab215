"""A fork-server template (trainer.forktemplate) as a supervisor uses it (ForkClient.attach):
a real template process, real forks of it, over its Unix socket."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psutil

from api.backends.local.template import Template, template_env
from api.backends.local.watchdog import child_env
from tests.conftest import Forks
from tests.support import wait_for
from trainer.contract.staged import OFFLINE_ENV
from trainer.forkclient import ForkClient, ForkedProcess


def test_a_server_forked_by_the_template_forks_children_at_once(forks: Forks,
                                                                 tmp_path: Path) -> None:
    template = forks.template()
    env = {**child_env(), **OFFLINE_ENV, "SECRET_OF_THE_JOB": "s3cret"}  # as a pod's server
    client = wait_for(lambda: ForkClient.attach(str(template), env, tmp_path, tmp_path / "log"),
                      timeout=120, what="the template to serve")
    try:
        assert psutil.Process(client.pid).ppid() == forks.template_process().pid
        pid = client.fork([sys.executable, "-m", "trainer.forktemplate", "--help"], env,
                          tmp_path, tmp_path / "child.log")
        assert pid is not None, (tmp_path / "log").read_text()
        assert ForkedProcess(client, pid).wait(timeout=60) == 0
        assert "--listen PATH" in (tmp_path / "child.log").read_text()
        # Its environment block is the template's: no secret of any job.
        assert "SECRET_OF_THE_JOB" not in psutil.Process(client.pid).environ()
    finally:
        client.close()
    wait_for(lambda: not psutil.pid_exists(client.pid)
             or psutil.Process(client.pid).status() == psutil.STATUS_ZOMBIE,
             timeout=30, what="the server to end with its client")


def test_the_template_refuses_children_that_would_import_otherwise(forks: Forks,
                                                                     tmp_path: Path) -> None:
    template = str(forks.template())
    env = {**child_env(), **OFFLINE_ENV}
    wait_for(lambda: (client := ForkClient.attach(template, env, tmp_path, tmp_path / "log"))
             and (client.close() or True), timeout=120, what="the template to serve")
    online = {**env, "HF_HUB_OFFLINE": "0"}
    assert ForkClient.attach(template, online, tmp_path, tmp_path / "log") is None
    assert ForkClient.attach(str(tmp_path / "nothing.sock"), env, tmp_path,
                             tmp_path / "log") is None
    served = ForkClient.attach(template, env, tmp_path, tmp_path / "log")  # it serves on
    assert served is not None
    served.close()


def test_a_template_holds_no_secret_and_ends_with_its_control_plane(
        tmp_path: Path) -> None:
    base = {**child_env(), "MIGRATOR_ADMIN_TOKEN": "t0ken", "HF_TOKEN": "hf",
            "AZURE_STORAGE_CONNECTION_STRING": "AccountKey=k3y"}
    environ = template_env(base)
    assert not {"MIGRATOR_ADMIN_TOKEN", "HF_TOKEN", "AZURE_STORAGE_CONNECTION_STRING"} & set(
        environ)
    assert environ["HF_HUB_OFFLINE"] == "1" and environ["PATH"] == os.environ["PATH"]
    # Without a value of its own, torch's import sets its inductor cache's: a child that has
    # the same value (its supervisor's control plane imported torch) imports alike.
    base.pop("TORCHINDUCTOR_CACHE_DIR", None)
    template = Template(base, tmp_path / "template.log")
    wait_for(template.socket.exists, timeout=120, what="the template to listen")
    assert "t0ken" not in str(psutil.Process(template.process.pid).environ())
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    pods = {**template_env(base), "TORCHINDUCTOR_CACHE_DIR": default_cache_dir()}
    served = ForkClient.attach(str(template.socket), pods, tmp_path, tmp_path / "log")
    assert served is not None, (tmp_path / "template.log").read_text()
    served.close()
    template.close()
    assert template.process.returncode == 0
    assert not template.directory.exists()
