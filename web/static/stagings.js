// Hub repositories staged for jobs: each one's status, bytes so far and in all, and its ETA,
// refreshed while any is running (a job naming a hub model or dataset waits for them).
import { api } from './api.js';
import { ago, bytes, fill, h, notice } from './dom.js';

const REFRESH_MS = 2000;

function stagingRow(staging) {
  const running = staging.status === 'running';
  const total = staging.bytes_total;
  const progress = running && total
    ? h('progress', { max: total, value: staging.bytes_done, 'aria-label': `${staging.repo_id} staged` })
    : null;
  const amount = `${bytes(staging.bytes_done)}${total ? ` of ${bytes(total)}` : ''}`;
  const eta = running && staging.eta_seconds != null ? ` · ${Math.round(staging.eta_seconds)} s left` : '';
  return h('tr', { dataset: { staging: staging.id } },
    h('td', {}, staging.kind),
    h('td', {}, h('span.mono', {}, `${staging.repo_id}@${staging.revision}`)),
    h('td', {}, h('span.badge', { dataset: { status: staging.status } }, staging.status)),
    h('td', {}, progress, ' ', h('span.small', {}, amount + eta)),
    h('td', {}, staging.error ? h('span.small.error', {}, staging.error)
      : ago(staging.finished_at || staging.started_at || staging.created_at)));
}

/** The section, and a function that stops its refreshing. */
export function stagingsSection() {
  const body = h('tbody');
  const status = h('p.notice', { role: 'status' });
  const section = h('section.stagings', { hidden: true },
    h('h2', {}, 'Hub models and datasets staged for jobs'),
    h('div.table-wrap', {}, h('table.stagings', {},
      h('thead', {}, h('tr', {}, h('th', {}, 'Kind'), h('th', {}, 'Repository'),
        h('th', {}, 'Status'), h('th', {}, 'Progress'), h('th', {}, 'Finished'))),
      body)),
    status);
  let stopped = false;
  let timer = null;

  async function refresh() {
    try {
      const page = await api('/api/v1/stagings?limit=200');
      if (stopped) return;
      fill(body, ...page.data.map(stagingRow));
      section.hidden = page.data.length === 0;
      if (page.data.some((staging) => staging.status === 'running')) {
        timer = setTimeout(refresh, REFRESH_MS);
      }
    } catch (error) {
      if (!stopped && !error.unauthorized) notice(status, `Could not list the stagings: ${error.message}`, 'error');
    }
  }

  refresh();
  return { section, stop: () => { stopped = true; clearTimeout(timer); } };
}
