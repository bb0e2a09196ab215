// Hub repositories staged for jobs, all kinds (the Datasets page) or one (the Base models page):
// each one's status, bytes so far and in all, and its ETA, refreshed while any is running (a job
// naming a hub model or dataset waits for them); a form that imports one ahead of the jobs, and
// a Delete button for those that have ended.
import { api } from './api.js';
import { STAGING_STATUS } from './contract.js';
import { ago, bytes, confirmDialog, fill, h, notice } from './dom.js';

const REFRESH_MS = 2000;
/** The kinds staged from a hub repository at a revision (the others: a job's tokens, a file). */
const HUB_KINDS = ['model', 'dataset'];

/** What it stages: a hub repository at its revision, a job's tokens, an imported file's URL. */
function named(staging) {
  if (staging.source) return staging.source;
  return staging.kind === 'tokens' ? `splits ${staging.repo_id}` : `${staging.repo_id}@${staging.revision}`;
}

/** Bytes so far of those in all, with the ETA, while it runs; what it holds once it ended. */
function size(staging, running) {
  const total = staging.bytes_total;
  if (!running) return h('span.small', {}, bytes(total ?? staging.bytes_done));
  const progress = total
    ? h('progress', { max: total, value: staging.bytes_done, 'aria-label': `${staging.repo_id} staged` })
    : null;
  const amount = `${bytes(staging.bytes_done)}${total ? ` of ${bytes(total)}` : ''}`;
  const eta = staging.eta_seconds != null ? ` · ${Math.round(staging.eta_seconds)} s left` : '';
  return [progress, ' ', h('span.small', {}, amount + eta)];
}

function stagingRow(staging, kind, onDelete) {
  const running = staging.status === STAGING_STATUS.running;
  const hub = HUB_KINDS.includes(staging.kind);
  const commit = staging.commit ? h('span.mono', { title: staging.commit }, staging.commit.slice(0, 12)) : '–';
  return h('tr', { dataset: { staging: staging.id } },
    kind ? null : h('td', {}, staging.kind),
    h('td', {}, h('span.mono', {}, hub ? staging.repo_id : named(staging))),
    h('td', {}, hub ? h('span.mono', {}, staging.revision) : '–'),
    h('td', {}, commit),
    h('td', {}, h('span.badge', { dataset: { status: staging.status } }, staging.status)),
    h('td.progress-cell', {}, size(staging, running)),
    h('td.num', {}, String(staging.files)),
    h('td', {}, staging.error ? h('span.small.error', {}, staging.error)
      : ago(staging.finished_at || staging.started_at || staging.created_at)),
    h('td', {}, trainLink(staging), running ? null : deleteButton(staging, onDelete)));
}

/** A staged model's link to the new-job form, with it (and its revision) filled in. */
function trainLink(staging) {
  if (staging.kind !== 'model' || staging.status !== STAGING_STATUS.succeeded) return null;
  const query = new URLSearchParams({ model: staging.repo_id, model_revision: staging.revision });
  return [h('a', { href: `#/new?${query}` }, 'New job'), ' '];
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

/** The import form: of `kind` where given, else of the kind chosen in it. */
function importForm(kind, onStarted, status) {
  const chosen = kind ? null : h('select#import-kind', { name: 'kind' },
    HUB_KINDS.map((name) => h('option', { value: name }, name)));
  const repo = h('input#import-repo', { name: 'repo_id', required: true, placeholder: 'org/name' });
  const revision = h('input#import-revision', { name: 'revision', value: 'main' });
  const form = h('form.import', {},
    chosen ? [h('label', { for: 'import-kind' }, 'Kind'), chosen] : null,
    h('label', { for: 'import-repo' }, kind ? `Hub ${kind}` : 'Repository'), repo,
    h('label', { for: 'import-revision' }, 'Revision'), revision,
    h('button', { type: 'submit' }, 'Import'));
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    try {
      const staging = await api('/api/v1/stagings', {
        method: 'POST',
        body: { kind: kind ?? chosen.value, repo_id: repo.value.trim(), revision: revision.value.trim() },
      });
      notice(status, `${staging.repo_id}@${staging.revision}: ${staging.status}.`);
      onStarted();
    } catch (error) {
      if (!error.unauthorized) notice(status, refusal(error), 'error');
    }
  });
  return form;
}

/**
 * The section, and a function that stops its refreshing. `kind` lists that kind alone (and
 * imports it); `title` heads it; `empty` says what to do where there is none.
 */
export function stagingsSection({ kind = null, title, empty = null } = {}) {
  const body = h('tbody');
  const status = h('p.notice', { role: 'status' });
  const none = h('p.muted', { hidden: true }, empty);
  const table = h('div.table-wrap', { hidden: true }, h('table.stagings', {},
    h('thead', {}, h('tr', {}, kind ? null : h('th', {}, 'Kind'), h('th', {}, 'Repository'),
      h('th', {}, 'Revision'), h('th', {}, 'Commit'), h('th', {}, 'Status'), h('th', {}, 'Size'),
      h('th.num', {}, 'Files'), h('th', {}, 'Finished'), h('th', {}))),
    body));
  const section = h('section.stagings', {},
    h('h2', {}, title),
    importForm(kind, () => refresh(), status), status, table, empty ? none : null);
  const query = new URLSearchParams({ limit: 200, ...(kind ? { kind } : {}) });
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
      const page = await api(`/api/v1/stagings?${query}`);
      if (stopped) return;
      fill(body, ...page.data.map((staging) => stagingRow(staging, kind, remove)));
      table.hidden = page.data.length === 0;
      none.hidden = page.data.length > 0;
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
