"""Live fault tolerance with real processes: a torchft lighthouse, three pods, a real SIGKILL."""

from __future__ import annotations

import json
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests.conftest import Processes
from tests.factories import (
    make_poisoned_csv,
    make_poisoned_model,
    make_reviews_csv,
    tiny_spec,
)
from tests.support import PEER_SECRET, has_ipv6_loopback, start_lighthouse, wait_for

pytestmark = pytest.mark.slow


READ: dict[Path, tuple[int, list[dict]]] = {}
"""What `records` read of each reports file so far: the offset after it, and its records."""


def records(path: Path) -> list[dict]:
    """The pods' reports so far; a line a pod is still writing is left for the next read. Each
    call reads on from where the last one stopped: tests poll this while their pods (which log
    every step's sample ids) fill the file, on the same two cores."""
    offset, found = READ.get(path, (0, []))
    if path.exists():
        with path.open("rb") as file:
            file.seek(offset)
            chunk = file.read()
        end = chunk.rfind(b"\n") + 1
        found = found + [json.loads(line) for line in chunk[:end].splitlines()]
        READ[path] = offset + end, found
    return list(found)


def live_spec(**overrides: Any) -> dict[str, Any]:
    return tiny_spec(fault_tolerance="live", **overrides)


def start_pod(processes: Processes, tmp_path: Path, inputs_dir: Path, lighthouse: str,
              spec: dict, ordinal: int, incarnation: int = 0, address: str = "127.0.0.1",
              **more_env: str):
    env = {"TRAINER_CONFIG": json.dumps(spec), "JOB_ID": "live", "POD_NAME": f"live-{ordinal}",
           "POD_INCARNATION": str(incarnation), "POD_ADDRESS": address,
           "PEER_SECRET": PEER_SECRET,
           "TORCHFT_LIGHTHOUSE": lighthouse, "INPUTS_DIR": str(inputs_dir),
           "CHECKPOINT_DIR": str(tmp_path / "checkpoints"), "MODEL_DIR": str(tmp_path / "model"),
           "TRAINER_CACHE_DIR": str(tmp_path / "cache"),
           "METRICS_FILE": str(tmp_path / "reports.jsonl"), "LOG_SAMPLE_IDS": "true",
           "OMP_NUM_THREADS": "1", **more_env}
    return processes.start([sys.executable, "-m", "trainer"], env,
                           tmp_path / f"pod-{ordinal}-{incarnation}.log")


def test_survivors_keep_training_and_a_killed_pod_rejoins_live(
        inputs_dir: Path, tmp_path: Path, processes: Processes) -> None:
    make_reviews_csv(inputs_dir / "reviews.csv", rows=2000)
    lighthouse = start_lighthouse(processes, tmp_path / "lighthouse.log", 3)
    reports = tmp_path / "reports.jsonl"
    spec = live_spec(epochs=6, checkpoint_every_steps=25)

    def start(ordinal: int, incarnation: int):
        return start_pod(processes, tmp_path, inputs_dir, lighthouse, spec, ordinal, incarnation)

    pods = [start(ordinal, 0) for ordinal in range(3)]

    def steps(pod: str, after: float = 0.0, participants: int | None = None) -> list[int]:
        return [r["data"]["step"] for r in records(reports)
                if r["kind"] == "metric" and r["pod"] == pod and r["time"] > after
                and participants in (None, r["data"]["participants"])]

    wait_for(lambda: len(steps("live-0", participants=3)) >= 10,
             what="three pods training together", timeout=120)
    pods[1].send_signal(signal.SIGKILL)
    killed_at = time.time()
    pods[1].wait(timeout=10)
    # The survivors keep committing steps while pod 1 is down.
    wait_for(lambda: all(len(steps(pod, killed_at, 2)) >= 5 for pod in ("live-0", "live-2")),
             timeout=60, what="survivors to commit steps without pod 1")
    restarted = start(1, 1)
    for process in (pods[0], pods[2], restarted):
        assert process.wait(timeout=240) == 0

    everything = records(reports)
    survivor_steps = [r for r in everything if r["kind"] == "metric" and r["pod"] == "live-0"
                      and killed_at < r["time"]]
    assert survivor_steps and min(r["data"]["participants"] for r in survivor_steps) == 2
    events = [r for r in everything if r["kind"] == "event"]
    assert any(e["pod"] == "live-1" and e["incarnation"] == "1" and e["data"]["type"] == "healed"
               for e in events)
    completed = {e["pod"]: e["data"]["checksum"] for e in events
                 if e["data"]["type"] == "completed"}
    assert set(completed) == {"live-0", "live-1", "live-2"}
    assert len(set(completed.values())) == 1, completed  # identical replicas after healing
    # Exactly once: per epoch, the windows of the committed steps cover the split once, every
    # pod trained only inside its step's window, and all agree on each window. (Not pod 0's
    # steps alone: a pod that started last fetches the first weights from a peer in its first
    # step and reports only the steps it trained in.)
    windows: dict[tuple[int, int], list[int]] = {}
    for r in everything:
        if r["kind"] == "samples":
            key = (r["data"]["epoch"], r["data"]["step"])
            assert windows.setdefault(key, r["data"]["window"]) == r["data"]["window"], key
            assert set(r["data"]["ids"]) <= set(r["data"]["window"]), key
    by_epoch: dict[int, Counter[int]] = {}
    for (epoch, _), window in windows.items():
        by_epoch.setdefault(epoch, Counter()).update(window)
    train_size = next(e["data"]["samples"]["train"] for e in events
                      if e["data"]["type"] == "started")
    assert sorted(by_epoch) == [1, 2, 3, 4, 5, 6]
    for epoch, counts in by_epoch.items():
        assert counts == Counter(range(train_size)), f"epoch {epoch}"


@pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback (::1) here")
def test_a_live_job_runs_on_ipv6_addresses(inputs_dir: Path, tmp_path: Path,
                                           processes: Processes) -> None:
    """Pods and lighthouse of an IPv6-only cluster: every server (lighthouse, torchft's manager,
    the heal server, the stores, gloo) listens on ::1 and every peer finds it there."""
    lighthouse = start_lighthouse(processes, tmp_path / "lighthouse.log", 2, host="::1")
    assert lighthouse.startswith("http://[::1]:")
    spec = live_spec(epochs=6)
    pods = [start_pod(processes, tmp_path, inputs_dir, lighthouse, spec, ordinal,
                      address="::1") for ordinal in (0, 1)]
    # Every pod starts from the seeded model: a heal, over HTTP, needs a pod that came back.
    wait_for(lambda: sum(r["kind"] == "metric" and r["pod"] == "live-0"
                         for r in records(tmp_path / "reports.jsonl")) >= 3,
             what="3 steps", timeout=120)
    pods[1].send_signal(signal.SIGKILL)
    pods[1].wait(timeout=10)
    pods[1] = start_pod(processes, tmp_path, inputs_dir, lighthouse, spec, 1, 1, address="::1")
    for ordinal, pod in enumerate(pods):
        assert pod.wait(timeout=240) == 0, (tmp_path / f"pod-{ordinal}-0.log").read_text()[-3000:]
    events = [r["data"] for r in records(tmp_path / "reports.jsonl") if r["kind"] == "event"]
    healed = [e for e in events if e["type"] == "healed"]
    assert healed and healed[0]["source_address"].startswith("http://[::1]:")
    completed = {e["checksum"] for e in events if e["type"] == "completed"}
    assert len(completed) == 1
    metrics = [r["data"] for r in records(tmp_path / "reports.jsonl") if r["kind"] == "metric"]
    assert max(m["participants"] for m in metrics) == 2


class Run(NamedTuple):
    losses: dict[int, float]
    """The surviving pod's loss of every step (the step's, every participant's)."""
    checksums: set[str]
    """Of the final weights, as each pod reported them."""
    alone: list[int]
    """Steps the surviving pod computed alone."""
    healed: list[str]
    """Pods that healed from a peer."""
    reports: list[dict[str, Any]]
    """Every report of every pod, in the order written."""

    def samples(self) -> list[dict[str, Any]]:
        """Each pod's samples of each step (`pod` added)."""
        return [r["data"] | {"pod": r["pod"]} for r in self.reports if r["kind"] == "samples"]


def test_a_pod_killed_and_recreated_changes_no_bit_of_what_the_job_computes(
        inputs_dir: Path, tmp_path: Path, processes: Processes) -> None:
    """A fixed global batch (trainer.shards) of three shards on two pods: the survivor computes
    the dead pod's shards, the recreated pod heals and takes its share back, and every step's
    loss and the final weights are those of the undisturbed run, to the bit; and those of one
    pod computing every shard. The pod killed is pod 0, which torchft ranks first: in its
    heal step the healer is ranked last all the same, and computes the smaller share."""
    make_reviews_csv(inputs_dir / "reviews.csv", rows=600)
    spec = live_spec(epochs=6, checkpoint_every_steps=0, max_eval_samples=40,
                     global_batch_size=24)

    def run(name: str, disturb: bool, pods_started: int = 2) -> Run:
        work = tmp_path / name
        work.mkdir()
        survivor = f"live-{pods_started - 1}"
        lighthouse = start_lighthouse(processes, work / "lighthouse.log", pods_started)
        pods = [start_pod(processes, work, inputs_dir, lighthouse, spec, o)
                for o in range(pods_started)]
        if disturb:
            wait_for(lambda: sum(r["kind"] == "metric" and r["pod"] == survivor
                                 for r in records(work / "reports.jsonl")) >= 15,
                     what="15 steps", timeout=120)
            pods[0].send_signal(signal.SIGKILL)
            pods[0].wait(timeout=10)
            wait_for(lambda: any(r["kind"] == "metric" and r["pod"] == survivor
                                 and r["data"]["participants"] == 1
                                 for r in records(work / "reports.jsonl")),
                     what="the survivor to train a step alone", timeout=60)
            pods[0] = start_pod(processes, work, inputs_dir, lighthouse, spec, 0, 1)
        for pod in pods:
            assert pod.wait(timeout=240) == 0
        everything = records(work / "reports.jsonl")
        metrics = [r["data"] for r in everything if r["kind"] == "metric" and r["pod"] == survivor]
        events = [r for r in everything if r["kind"] == "event"]
        return Run({m["step"]: m["loss"] for m in metrics},
                   {r["data"]["checksum"] for r in events if r["data"]["type"] == "completed"},
                   [m["step"] for m in metrics if m["participants"] == 1],
                   [r["pod"] for r in events if r["data"]["type"] == "healed"],
                   everything)

    undisturbed, disturbed = run("undisturbed", False), run("disturbed", True)
    alone = run("alone", False, pods_started=1)
    # The kill happened: pod 1 trained steps alone, and pod 0's new incarnation healed.
    assert max(disturbed.alone) > 15 and "live-0" in disturbed.healed
    assert len(undisturbed.checksums) == 1 and disturbed.checksums == undisturbed.checksums
    assert disturbed.losses == undisturbed.losses  # every step's, to the bit
    # From the first step on: no pod's shards are lost to a sync at step 0.
    assert alone.checksums == undisturbed.checksums and alone.losses == undisturbed.losses
    # Undisturbed, pod 0 is ranked first and takes two shards; in the step it healed in, it
    # took one, last, and pod 1 the other two.
    first = min(s["step"] for s in undisturbed.samples())
    assert {(s["pod"], s["rank"], len(s["ids"])) for s in undisturbed.samples()
            if s["step"] == first} == {("live-0", 0, 16), ("live-1", 1, 8)}
    healed_in = min(s["step"] for s in disturbed.samples()
                    if s["pod"] == "live-0" and s["step"] > max(disturbed.alone))
    assert {(s["pod"], s["rank"], len(s["ids"])) for s in disturbed.samples()
            if s["step"] == healed_in} == {("live-0", 1, 8), ("live-1", 0, 16)}
    # Only the shards' order moved: pod 0, torchft's first, was the primary again from that
    # step on (it said so before reporting the step), not one step later.
    pod_0 = [r for r in disturbed.reports if r["pod"] == "live-0"]
    became = max(i for i, r in enumerate(pod_0)
                 if r["kind"] == "event" and r["data"]["type"] == "primary")
    assert became < next(i for i, r in enumerate(pod_0)
                         if r["kind"] == "samples" and r["data"]["step"] == healed_in)


def test_a_pod_loads_its_data_before_the_lighthouse_hears_of_it(
        inputs_dir: Path, tmp_path: Path, processes: Processes) -> None:
    """A pod is heard from once it is ready to train: its peers' quorums wait for a pod heard
    from moments ago, so one still loading (or failing to) would cost them that wait."""
    (inputs_dir / "bad.csv").write_text("text,label\n" + "".join(
        f"review {i},{['a', 'b', 'c'][i % 3]}\n" for i in range(30)))
    lighthouse = start_lighthouse(processes, tmp_path / "lighthouse.log", 1)
    pod = start_pod(processes, tmp_path, inputs_dir, lighthouse,
                    live_spec(dataset="bad.csv"), 0)
    assert pod.wait(timeout=120) == 2
    log = (tmp_path / "pod-0-0.log").read_text()
    assert "exactly 2 classes, found 3" in log and "joined lighthouse" not in log
    assert "live-0" not in (tmp_path / "lighthouse.log").read_text()


def test_replicas_skip_a_step_that_one_of_them_made_nan_together(
        inputs_dir: Path, tmp_path: Path, processes: Processes) -> None:
    """One replica's NaN loss spreads to every replica's gradients through their all-reduce:
    all of them skip that step (committed, no update), or none would hold the same weights."""
    make_poisoned_model(inputs_dir / "poisoned")
    make_poisoned_csv(inputs_dir / "poisoned.csv")
    lighthouse = start_lighthouse(processes, tmp_path / "lighthouse.log", 2)
    spec = live_spec(model="poisoned", dataset="poisoned.csv", epochs=2, nonfinite_loss="skip")
    pods = [start_pod(processes, tmp_path, inputs_dir, lighthouse, spec, ordinal)
            for ordinal in (0, 1)]
    for ordinal, pod in enumerate(pods):
        assert pod.wait(timeout=240) == 0, (tmp_path / f"pod-{ordinal}-0.log").read_text()[-3000:]
    everything = records(tmp_path / "reports.jsonl")
    skipped = {pod: [(r["data"]["step"], r["data"]["skipped"]) for r in everything
                     if r["pod"] == pod and r["kind"] == "event"
                     and r["data"]["type"] == "step_skipped"] for pod in ("live-0", "live-1")}
    assert len(skipped["live-0"]) == 2 and skipped["live-0"] == skipped["live-1"]  # each epoch
    # The step's loss is every shard's (trainer.shards): NaN on both replicas, not only on the
    # one that computed the poisoned text.
    losses = [r["data"]["loss"] is None for r in everything
              if r["kind"] == "event" and r["data"]["type"] == "step_skipped"
              and r["data"]["step"] == skipped["live-0"][0][0]]
    assert losses == [True, True]
    completed = {r["data"]["checksum"] for r in everything
                 if r["kind"] == "event" and r["data"]["type"] == "completed"}
    assert len(completed) == 1  # identical replicas
    windows: dict[tuple[int, int], list[int]] = {}
    for r in everything:
        if r["kind"] == "samples":
            windows.setdefault((r["data"]["epoch"], r["data"]["step"]), r["data"]["window"])
    for epoch in (1, 2):  # the skipped steps' samples count as used, once
        used = Counter(i for (e, _), window in windows.items() if e == epoch for i in window)
        assert set(used.values()) == {1}


def test_a_survivor_takes_over_checkpoints_and_export_when_the_primary_dies(
        inputs_dir: Path, tmp_path: Path, processes: Processes) -> None:
    make_reviews_csv(inputs_dir / "reviews.csv", rows=1000)
    lighthouse = start_lighthouse(processes, tmp_path / "lighthouse.log", 2)
    spec = live_spec(epochs=4, checkpoint_every_steps=10)
    primary, survivor = (start_pod(processes, tmp_path, inputs_dir, lighthouse, spec, o)
                         for o in (0, 1))
    reports = tmp_path / "reports.jsonl"
    wait_for(lambda: any(r["kind"] == "checkpoint" for r in records(reports)),
             what="the primary's first checkpoint", timeout=120)
    primary.send_signal(signal.SIGKILL)  # and it never comes back
    killed_at = time.time()
    assert survivor.wait(timeout=240) == 0

    everything = records(reports)
    assert {r["pod"] for r in everything
            if r["kind"] == "checkpoint" and r["time"] < killed_at} == {"live-0"}
    after = [r for r in everything if r["time"] > killed_at]
    assert any(r["kind"] == "event" and r["data"]["type"] == "primary" for r in after)
    assert {r["pod"] for r in after if r["kind"] == "checkpoint"} == {"live-1"}
    completed = [r["data"] for r in after if r["kind"] == "event"
                 and r["data"]["type"] == "completed"]
    assert [(c["primary"], c["model_dir"]) for c in completed] == [
        (True, str(tmp_path / "model"))]
    assert (tmp_path / "model" / "config.json").is_file()


def test_the_primary_dying_after_the_last_step_loses_nothing(
        inputs_dir: Path, tmp_path: Path, processes: Processes) -> None:
    make_reviews_csv(inputs_dir / "reviews.csv", rows=4000)
    lighthouse = start_lighthouse(processes, tmp_path / "lighthouse.log", 2)
    # Evaluating one sample at a time keeps the primary busy for seconds between its last step
    # and its final checkpoint: the kill lands there even when reports arrive late.
    spec = live_spec(epochs=1, batch_size=16, checkpoint_every_steps=0, eval_batch_size=1)
    primary, survivor = (start_pod(processes, tmp_path, inputs_dir, lighthouse, spec, o)
                         for o in (0, 1))
    reports = tmp_path / "reports.jsonl"

    def last_step_done() -> bool:
        everything = records(reports)
        train = next((r["data"]["samples"]["train"] for r in everything
                      if r["kind"] == "event" and r["data"]["type"] == "started"), None)
        return any(r["kind"] == "metric" and r["pod"] == "live-0"
                   and r["data"]["samples_seen"] == train for r in everything)

    # Killed while it evaluates the last epoch: before its final checkpoint and export.
    wait_for(last_step_done, what="the last training step", timeout=120)
    primary.send_signal(signal.SIGKILL)
    assert survivor.wait(timeout=240) == 0
    assert "the primary wrote no final checkpoint" in (tmp_path / "pod-1-0.log").read_text()
    final = [r["data"] for r in records(reports)
             if r["kind"] == "event" and r["data"]["type"] == "completed"]
    assert [(c["model_dir"], c["primary"]) for c in final] == [(str(tmp_path / "model"), False)]
    assert (tmp_path / "model" / "config.json").is_file()

    # A pod recreated now resumes from that final checkpoint: it trains nothing again.
    assert start_pod(processes, tmp_path, inputs_dir, lighthouse, spec, 0, 1).wait(timeout=240) == 0
    again = [r for r in records(reports) if r["pod"] == "live-0" and r["incarnation"] == "1"]
    assert not [r for r in again if r["kind"] == "metric"]
    resumed = [r["data"] for r in again if r["kind"] == "event" and r["data"]["type"] == "resumed"]
    assert resumed and resumed[0]["step"] == final[0]["step"]


def test_a_pod_that_gets_sigterm_leaves_without_failing_a_step_of_its_peers(
        inputs_dir: Path, tmp_path: Path, processes: Processes) -> None:
    make_reviews_csv(inputs_dir / "reviews.csv", rows=2000)
    lighthouse = start_lighthouse(processes, tmp_path / "lighthouse.log", 3)
    reports = tmp_path / "reports.jsonl"
    # Long enough that the peers are still training when the recreated pod has started and
    # healed: a fork of the session's fork server, it healed at step 28 of 480 in a suite run.
    spec = live_spec(epochs=6, checkpoint_every_steps=25)
    pods = [start_pod(processes, tmp_path, inputs_dir, lighthouse, spec, o) for o in range(3)]

    def events(kind: str) -> list[dict]:
        return [r for r in records(reports) if r["kind"] == "event" and r["data"]["type"] == kind]

    def steps(pod: str) -> list[dict]:
        return [r["data"] for r in records(reports) if r["kind"] == "metric" and r["pod"] == pod]

    wait_for(lambda: sum(s["participants"] == 3 for s in steps("live-1")) >= 10,
             what="three pods training together", timeout=120)
    pods[0].send_signal(signal.SIGTERM)  # the primary, which writes checkpoints
    assert pods[0].wait(timeout=60) == 0
    left = events("left")
    assert [(e["pod"], e["data"]["pod"]) for e in left] == [("live-0", "live-0")]
    step = left[0]["data"]["step"]
    assert max(s["step"] for s in steps("live-0")) == step  # its last committed step

    # Recreated at once (as a backend does): it takes seconds to start and then heals.
    rejoined = start_pod(processes, tmp_path, inputs_dir, lighthouse, spec, 0, 1)
    for process in (pods[1], pods[2], rejoined):
        assert process.wait(timeout=240) == 0

    # The peers went on at the next step without a failed collective (no failure detection,
    # nothing redone), and the lighthouse did not wait for the pod that left.
    for pod in ("live-1", "live-2"):
        numbers = [s["step"] for s in steps(pod)]
        assert numbers == list(range(1, len(numbers) + 1))
        assert [s["participants"] for s in steps(pod) if s["step"] == step + 1] == [2]
        log = (tmp_path / f"pod-{pod[-1]}-0.log").read_text()
        assert "should_commit=True" in log and "should_commit=False" not in log
    lighthouse_log = (tmp_path / "lighthouse.log").read_text()
    after_leave = lighthouse_log.split(" left\n", 1)[1].splitlines()
    assert "fast quorum" in next(line for line in after_leave if "quorum [" in line)
    # Another pod took over as the primary; the pod recreated healed; replicas are identical.
    assert any(e["pod"] in ("live-1", "live-2") for e in events("primary"))
    assert any(e["pod"] == "live-0" and e["incarnation"] == "1" for e in events("healed"))
    completed = {e["pod"]: e["data"]["checksum"] for e in events("completed")}
    assert set(completed) == {"live-0", "live-1", "live-2"}
    assert len(set(completed.values())) == 1, completed


def test_a_killed_pod_of_an_8bit_lora_job_heals_just_the_adapters(
        inputs_dir: Path, tmp_path: Path, processes: Processes) -> None:
    """An int8 base (bitsandbytes' CPU kernels in place of CUDA's): the killed pod reloads the
    base itself and fetches only the float32 adapters, the head and the trainer's state."""
    make_reviews_csv(inputs_dir / "reviews.csv", rows=1000)
    lighthouse = start_lighthouse(processes, tmp_path / "lighthouse.log", 2)
    reports = tmp_path / "reports.jsonl"
    # The restarted pod healed at step 30 of 1,200 with 30 epochs in a suite run: 10 leave
    # it 400.
    spec = live_spec(epochs=10, finetune="lora", quantization="8bit", learning_rate=0.03)

    def start(ordinal: int, incarnation: int):
        return start_pod(processes, tmp_path, inputs_dir, lighthouse, spec, ordinal,
                         incarnation, QUANTIZE_ON_CPU="true")

    def steps(pod: str, after: float = 0.0) -> list[int]:
        return [r["data"]["step"] for r in records(reports)
                if r["kind"] == "metric" and r["pod"] == pod and r["time"] > after]

    pods = [start(ordinal, 0) for ordinal in range(2)]
    wait_for(lambda: len(steps("live-1")) >= 5, what="both pods training", timeout=120)
    pods[1].send_signal(signal.SIGKILL)
    killed_at = time.time()
    pods[1].wait(timeout=10)
    wait_for(lambda: len(steps("live-0", killed_at)) >= 3, timeout=60,
             what="pod 0 to train on alone")
    restarted = start(1, 1)
    for process in (pods[0], restarted):
        assert process.wait(timeout=240) == 0

    events = [r for r in records(reports) if r["kind"] == "event"]
    healed = [e["data"] for e in events if e["data"]["type"] == "healed"]
    assert [h["target"] for h in healed] == ["live-1"]
    from transformers import AutoModelForSequenceClassification

    exported = AutoModelForSequenceClassification.from_pretrained(tmp_path / "model")
    whole = sum(v.numel() * v.element_size() for v in exported.state_dict().values())
    assert 0 < healed[0]["bytes"] < whole / 5
    completed = {e["pod"]: e["data"]["checksum"] for e in events
                 if e["data"]["type"] == "completed"}
    assert set(completed) == {"live-0", "live-1"}
    assert len(set(completed.values())) == 1, completed  # identical replicas, int8 base and all


def test_a_stranger_can_neither_join_nor_evict_nor_be_healed_from(
        inputs_dir: Path, tmp_path: Path, processes: Processes) -> None:
    """A stock torchft replica asks the job's lighthouse for a quorum at step 10^9 while a pod
    trains alone, serving a state whose unpickling would run code, and tells the lighthouse
    that the pod left. Were it heard, the pod would heal from it (or be evicted)."""
    make_reviews_csv(inputs_dir / "reviews.csv", rows=1000)
    lighthouse = start_lighthouse(processes, tmp_path / "lighthouse.log", 1)
    pod = start_pod(processes, tmp_path, inputs_dir, lighthouse, live_spec(epochs=4), 0)
    reports = tmp_path / "reports.jsonl"
    wait_for(lambda: any(r["kind"] == "metric" for r in records(reports)),
             what="the pod to train", timeout=120, process=pod)
    marker, result = tmp_path / "stranger-code-ran", tmp_path / "stranger.json"
    stranger = processes.start(
        [sys.executable, "-m", "tests.trainer.fault_tolerance.stranger", "--lighthouse", lighthouse,
         "--marker", str(marker), "--victim", "live-0", "--result", str(result)], {},
        tmp_path / "stranger.log")
    assert stranger.wait(timeout=120) == 0, (tmp_path / "stranger.log").read_text()
    assert pod.wait(timeout=240) == 0

    # The stock client retries a refused quorum until its timeout; the lighthouse says why.
    attempts = json.loads(result.read_text())
    assert attempts.pop("join").startswith("refused:")
    assert "not members of this job" in (tmp_path / "lighthouse.log").read_text()
    assert len(attempts) == 2 and all(
        v.startswith("refused:") and "not a member" in v for v in attempts.values())
    everything = records(reports)
    assert {r["data"]["participants"] for r in everything if r["kind"] == "metric"} == {1}
    assert not [r for r in everything if r["kind"] == "event"
                and r["data"]["type"] in ("healed", "left")]
    assert [r["data"]["type"] for r in everything if r["kind"] == "event"].count(
        "completed") == 1
    assert not marker.exists()
