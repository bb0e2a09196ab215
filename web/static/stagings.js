// Hub repositories staged for jobs: each one's status, bytes so far and in all, and its ETA,
// refreshed while any is running (a job naming a hub model or dataset waits for them); a form
// that imports one ahead of the jobs, and a Delete button for those that have ended.
import { api } from './api.js';
import { STAGING_STATUS } from './contract.js';
import { ago, bytes, confirmDialog, fill, h, notice } from './dom.js';

const REFRESH_MS = 2000;

/** What it stages: a hub repository at its revision, a job's tokens, an imported file's URL. */
function named(staging) {
  if (staging.source) return staging.source;
  return staging.kind === 'tokens' ? `splits ${staging.repo_id}` : `${staging.repo_id}@${staging.revision}`;
}

function stagingRow(staging, onDelete) {
  const running = staging.status === STAGING_STATUS.running;
  const total = staging.bytes_total;
  const progress = running && total
    ? h('progress', { max: total, value: staging.bytes_done, 'aria-label': `${staging.repo_id} staged` })
    : null;
  const amount = `${bytes(staging.bytes_done)}${total ? ` of ${bytes(total)}` : ''}`;
  const eta = running && staging.eta_seconds != null ? ` · ${Math.round(staging.eta_seconds)} s left` : '';
  return h('tr', { dataset: { staging: staging.id } },
    h('td', {}, staging.kind),
    h('td', {}, h('span.mono', {}, named(staging))),
    h('td', {}, h('span.badge', { dataset: { status: staging.status } }, staging.status)),
    h('td', {}, progress, ' ', h('span.small', {}, amount + eta)),
    h('td', {}, staging.error ? h('span.small.error', {}, staging.error)
      : ago(staging.finished_at || staging.started_at || staging.created_at)),
    h('td', {}, running ? null : deleteButton(staging, onDelete)));
}

function deleteButton(staging, onDelete) {
  const button = h('button.small.danger', { type: 'button' }, 'Delete');
  button.addEventListener('click', () => onDelete(staging));
  return button;
}

/** A 422's problems, each with the field it is about; else the error's message. */
function refusal(error) {
  if (!Array.isArray(error.detail)) return error.message;
  return error.detail.map((problem) => `${(problem.loc || []).at(-1)}: ${problem.msg}`).join('; ');
}

function importForm(onStarted, status) {
  const kind = h('select#import-kind', { name: 'kind' },
    h('option', { value: 'model' }, 'model'), h('option', { value: 'dataset' }, 'dataset'));
  const repo = h('input#import-repo', { name: 'repo_id', required: true, placeholder: 'org/name' });
  const revision = h('input#import-revision', { name: 'revision', value: 'main' });
  const form = h('form.import', {},
    h('label', { for: 'import-kind' }, 'Kind'), kind,
    h('label', { for: 'import-repo' }, 'Repository'), repo,
    h('label', { for: 'import-revision' }, 'Revision'), revision,
    h('button', { type: 'submit' }, 'Import'));
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    try {
      const staging = await api('/api/v1/stagings', {
        method: 'POST',
        body: { kind: kind.value, repo_id: repo.value.trim(), revision: revision.value.trim() },
      });
      notice(status, `${staging.repo_id}@${staging.revision}: ${staging.status}.`);
      onStarted();
    } catch (error) {
      if (!error.unauthorized) notice(status, refusal(error), 'error');
    }
  });
  return form;
}

/** The section, and a function that stops its refreshing. */
export function stagingsSection() {
  const body = h('tbody');
  const status = h('p.notice', { role: 'status' });
  const table = h('div.table-wrap', { hidden: true }, h('table.stagings', {},
    h('thead', {}, h('tr', {}, h('th', {}, 'Kind'), h('th', {}, 'Repository'),
      h('th', {}, 'Status'), h('th', {}, 'Progress'), h('th', {}, 'Finished'), h('th', {}))),
    body));
  const section = h('section.stagings', {},
    h('h2', {}, 'Hub models and datasets staged for jobs'),
    importForm(() => refresh(), status), status, table);
  let stopped = false;
  let timer = null;

  async function remove(staging) {
    const what = named(staging);
    if (!await confirmDialog('Delete staging', `Delete the staged ${staging.kind} ${what}?`, 'Delete')) return;
    try {
      await api(`/api/v1/stagings/${encodeURIComponent(staging.id)}`, { method: 'DELETE' });
      notice(status, `Deleted ${what}.`);
      refresh();
    } catch (error) {
      if (!error.unauthorized) notice(status, error.message, 'error');
    }
  }

  async function refresh() {
    clearTimeout(timer);
    try {
      const page = await api('/api/v1/stagings?limit=200');
      if (stopped) return;
      fill(body, ...page.data.map((staging) => stagingRow(staging, remove)));
      table.hidden = page.data.length === 0;
      if (page.data.some((staging) => staging.status === STAGING_STATUS.running)) {
        timer = setTimeout(refresh, REFRESH_MS);
      }
    } catch (error) {
      if (!stopped && !error.unauthorized) notice(status, `Could not list the stagings: ${error.message}`, 'error');
    }
  }

  refresh();
  return { section, stop: () => { stopped = true; clearTimeout(timer); } };
}
