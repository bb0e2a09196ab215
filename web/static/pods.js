// The pods grid: one row per ordinal, each with Kill and Migrate buttons (after a confirm), and
// the replicas control that scales the job.
import { api } from './api.js';
import { JOB_STATUS, PARALLELISM, POD_PHASE } from './contract.js';
import { ago, confirmDialog, fill, h, notice, setBadge, setText } from './dom.js';
import { podsOf } from './jobs.js';

const SCALABLE = [JOB_STATUS.starting, JOB_STATUS.running, JOB_STATUS.degraded];
const MIGRATABLE = [JOB_STATUS.running, JOB_STATUS.degraded];

/** What to show for a pod: its phase, or "Killed" from the kill until its restart is seen. */
export function shownPhase(pod, view) {
  const kill = view.kills.get(pod.ordinal);
  const restarts = Math.max(pod.restarts, view.restarts.get(pod.ordinal) ?? 0);
  if (kill && restarts <= kill.restarts && !view.finished) return 'Killed';
  return pod.phase;
}

/** The note beside a pod's phase: what is happening to it, or how it came back. */
function noteOf(pod, phase, view) {
  const rejoin = view.rejoins.get(pod.ordinal);
  const kill = view.kills.get(pod.ordinal);
  if (phase === 'Killed') return 'waiting for its controller';
  if (!view.finished && pod.ordinal >= podsOf(view.job.spec)) return 'leaving: scaled down';
  if (!view.finished && view.migrating.has(pod.ordinal)) return 'migrating';
  if (!view.finished && view.arriving.has(pod.ordinal)) return 'joining';
  if (rejoin && (!kill || rejoin.time >= kill.time)) return `rejoined${rejoin.step !== undefined ? ` at step ${rejoin.step}` : ''}`;
  if (kill && phase !== POD_PHASE.Running) return 'recreated';
  return '';
}

export class Pods {
  /** `status`: the page's notice; `form`: the replicas control's (empty) form; `onScaled(job)`:
   * called with the job the PATCH answered. */
  constructor(body, status, view, form, onScaled) {
    this.body = body;
    this.status = status;
    this.view = view;
    this.rows = new Map();
    this.form = form;
    this.onScaled = onScaled;
    this.replicas = h('input#replicas', {
      type: 'number', name: 'replicas', min: '1', step: '1', inputmode: 'numeric',
      'aria-describedby': 'replicas-limit',
    });
    this.limit = h('span.hint#replicas-limit');
    this.scaleButton = h('button.small', { type: 'submit' }, 'Scale');
    this.shownReplicas = null;
    fill(form, h('label', { for: 'replicas' }, 'Replicas'), this.replicas, this.limit,
      this.scaleButton);
    form.addEventListener('submit', (event) => {
      event.preventDefault();
      this.scale();
    });
  }

  row(pod) {
    let row = this.rows.get(pod.ordinal);
    if (row) return row;
    const cells = {
      name: h('td.mono'), phase: h('span.badge'), note: h('span.small.note'),
      restarts: h('td.num'), heartbeat: h('td'), step: h('td.num'),
      kill: h('button.danger.small', {
        type: 'button', on: { click: () => this.kill(pod.ordinal) },
      }, 'Kill'),
      migrate: h('button.small', {
        type: 'button', on: { click: () => this.migrate(pod.ordinal) },
      }, 'Migrate'),
    };
    row = h('tr', { dataset: { ordinal: String(pod.ordinal) } },
      h('td.num', {}, String(pod.ordinal)), cells.name,
      h('td', {}, cells.phase, ' ', cells.note),
      cells.restarts, cells.heartbeat, cells.step, h('td', {}, cells.kill, ' ', cells.migrate));
    row.cells_ = cells;
    this.rows.set(pod.ordinal, row);
    this.body.append(row);
    return row;
  }

  render() {
    const { view } = this;
    const job = view.job;
    if (!job) return;
    // The API lists a scaled-away pod until it is gone; the stream may say so first.
    const count = podsOf(job.spec);
    const pipeline = job.spec.parallelism === PARALLELISM.pipeline;
    const pods = job.pods.filter((p) => p.ordinal < count || p.phase !== POD_PHASE.Removed);
    const listed = new Set(pods.map((p) => p.ordinal));
    for (const [ordinal, row] of this.rows) {
      if (!listed.has(ordinal)) {
        row.remove();
        this.rows.delete(ordinal);
      }
    }
    const live = MIGRATABLE.includes(job.status);
    for (const pod of pods) {
      const row = this.row(pod);
      const cells = row.cells_;
      const phase = shownPhase(pod, view);
      const leaving = pod.ordinal >= count;
      row.dataset.phase = phase;
      // A pipeline's pods: which replica and which stage of the model each one runs.
      setText(cells.name, pipeline ? `${pod.name} · replica ${pod.replica}, stage ${pod.stage}`
        : pod.name);
      setBadge(cells.phase, phase);
      const note = noteOf(pod, phase, view);
      setText(cells.note, note);
      row.dataset.rejoined = note.startsWith('rejoined') ? 'true' : 'false';
      setText(cells.restarts, Math.max(pod.restarts, view.restarts.get(pod.ordinal) ?? 0));
      setText(cells.heartbeat, ago(pod.last_heartbeat));
      const step = Math.max(pod.step ?? 0, view.podSteps.get(pod.name) ?? 0);
      setText(cells.step, step || '–');
      cells.kill.disabled = view.finished || phase !== POD_PHASE.Running || leaving;
      cells.kill.setAttribute('aria-label', `Kill pod ${pod.ordinal} (${pod.name})`);
      // A stage pod holds a part of its replica's model: pipeline pods do not migrate yet.
      cells.migrate.disabled = !live || pipeline || phase !== POD_PHASE.Running || leaving;
      cells.migrate.setAttribute('aria-label', `Migrate pod ${pod.ordinal} (${pod.name})`);
    }
    this.renderReplicas();
  }

  renderReplicas() {
    const { job } = this.view;
    const replicas = job.spec.replicas;
    const max = job.spec.max_replicas;
    // A pipeline job cannot be scaled yet.
    this.form.hidden = !SCALABLE.includes(job.status) || job.spec.parallelism === PARALLELISM.pipeline;
    this.replicas.max = String(max);
    setText(this.limit, `of at most ${max}`);
    // A value being typed stays until the job's count itself changes.
    if (replicas !== this.shownReplicas) {
      this.replicas.value = String(replicas);
      this.replicas.removeAttribute('aria-invalid');
      this.shownReplicas = replicas;
    }
  }

  /** A message under the title: an error stays, a confirmation goes after a while. */
  tell(message, kind = 'info') {
    clearTimeout(this.clearing);
    notice(this.status, message, kind);
    if (kind !== 'error') this.clearing = setTimeout(() => notice(this.status, ''), 10_000);
  }

  async scale() {
    const { view } = this;
    // The server judges the value (1 to max_replicas) and says what is wrong with it.
    const replicas = this.replicas.value === '' ? null : Number(this.replicas.value);
    this.scaleButton.disabled = true;
    this.replicas.removeAttribute('aria-invalid');
    try {
      const job = await api(`/api/v1/jobs/${encodeURIComponent(view.id)}`,
        { method: 'PATCH', body: { replicas } });
      const count = job.spec.replicas;
      this.tell(`Scaled to ${count} pod${count === 1 ? '' : 's'}; the pods follow.`);
      this.onScaled(job);
    } catch (error) {
      if (error.unauthorized) return;
      if (error.status === 422) this.replicas.setAttribute('aria-invalid', 'true');
      this.tell(`Not scaled: ${error.message}`, 'error');
    } finally {
      this.scaleButton.disabled = false;
    }
  }

  async kill(ordinal) {
    const { view } = this;
    const name = `${view.id}-${ordinal}`;
    const ok = await confirmDialog(`Kill pod ${ordinal}?`,
      `${name} is killed at once (SIGKILL to its process group, like a node failure). `
      + 'The other pods keep training; its controller recreates it and it rejoins.', 'Kill pod');
    if (!ok) return;
    try {
      await api(`/api/v1/jobs/${encodeURIComponent(view.id)}/pods/${ordinal}/kill`,
        { method: 'POST', body: { grace_seconds: 0 } });
      this.tell(`Pod ${ordinal} killed; watch it come back.`);
    } catch (error) {
      if (!error.unauthorized) this.tell(`Pod ${ordinal} was not killed: ${error.message}`, 'error');
    }
  }

  async migrate(ordinal) {
    const { view } = this;
    const name = `${view.id}-${ordinal}`;
    const ok = await confirmDialog(`Migrate pod ${ordinal}?`,
      `A replacement of ${name} starts beside it, heals from a peer and takes part; then the `
      + 'old one leaves after a committed step. Training goes on throughout.', 'Migrate pod');
    if (!ok) return;
    try {
      await api(`/api/v1/jobs/${encodeURIComponent(view.id)}/pods/${ordinal}/migrate`,
        { method: 'POST' });
      this.tell(`Pod ${ordinal} is migrating; its replacement starts.`);
    } catch (error) {
      if (!error.unauthorized) this.tell(`Pod ${ordinal} was not migrated: ${error.message}`, 'error');
    }
  }
}
