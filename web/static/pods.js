// The pods grid: one row per ordinal, each with a Kill button (after a confirm).
import { api } from './api.js';
import { ago, confirmDialog, h, notice, setBadge, setText } from './dom.js';

/** What to show for a pod: its phase, or "Killed" from the kill until its restart is seen. */
export function shownPhase(pod, view) {
  const kill = view.kills.get(pod.ordinal);
  const restarts = Math.max(pod.restarts, view.restarts.get(pod.ordinal) ?? 0);
  if (kill && restarts <= kill.restarts && !view.finished) return 'Killed';
  return pod.phase;
}

export class Pods {
  constructor(body, status, view) {
    this.body = body;
    this.status = status;
    this.view = view;
    this.rows = new Map();
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
    };
    row = h('tr', { dataset: { ordinal: String(pod.ordinal) } },
      h('td.num', {}, String(pod.ordinal)), cells.name,
      h('td', {}, cells.phase, ' ', cells.note),
      cells.restarts, cells.heartbeat, cells.step, h('td', {}, cells.kill));
    row.cells_ = cells;
    this.rows.set(pod.ordinal, row);
    this.body.append(row);
    return row;
  }

  render() {
    const { view } = this;
    const job = view.job;
    if (!job) return;
    for (const pod of job.pods) {
      const row = this.row(pod);
      const cells = row.cells_;
      const phase = shownPhase(pod, view);
      row.dataset.phase = phase;
      setText(cells.name, pod.name);
      setBadge(cells.phase, phase);
      const rejoin = view.rejoins.get(pod.ordinal);
      const kill = view.kills.get(pod.ordinal);
      let note = '';
      if (phase === 'Killed') note = 'waiting for its controller';
      else if (rejoin && (!kill || rejoin.time >= kill.time)) note = `rejoined${rejoin.step !== undefined ? ` at step ${rejoin.step}` : ''}`;
      else if (kill && phase !== 'Running') note = 'recreated';
      setText(cells.note, note);
      row.dataset.rejoined = note.startsWith('rejoined') ? 'true' : 'false';
      setText(cells.restarts, Math.max(pod.restarts, view.restarts.get(pod.ordinal) ?? 0));
      setText(cells.heartbeat, ago(pod.last_heartbeat));
      const step = Math.max(pod.step ?? 0, view.podSteps.get(pod.name) ?? 0);
      setText(cells.step, step || '–');
      cells.kill.disabled = view.finished || phase !== 'Running';
      cells.kill.setAttribute('aria-label', `Kill pod ${pod.ordinal} (${pod.name})`);
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
      notice(this.status, `Pod ${ordinal} killed; watch it come back.`);
      clearTimeout(this.clearing);
      this.clearing = setTimeout(() => notice(this.status, ''), 10_000);
    } catch (error) {
      if (!error.unauthorized) notice(this.status, `Pod ${ordinal} was not killed: ${error.message}`, 'error');
    }
  }
}
