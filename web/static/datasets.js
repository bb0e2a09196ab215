// Datasets: upload (drop a file or pick one, with a progress bar), the list, one dataset's
// classes and first rows, and the hub repositories staged for jobs; the new-job form offers
// the datasets for its dataset field.
import { api, refused } from './api.js';
import { ago, bytes, confirmDialog, fill, h, notice, offerChoices, setText } from './dom.js';
import { stagingsSection } from './stagings.js';
import { state } from './state.js';

const ACCEPT = '.csv,.tsv,.jsonl,.ndjson,.parquet';

/** POST the file as the body (the API streams it to disk), reporting the share sent. */
function upload(file, params, onProgress) {
  return new Promise((resolve, reject) => {
    const query = new URLSearchParams({ name: file.name, ...params });
    const request = new XMLHttpRequest();
    request.open('POST', `/api/v1/datasets?${query}`);
    request.setRequestHeader('Authorization', `Bearer ${state.token}`);
    request.setRequestHeader('Accept', 'application/json');
    request.upload.onprogress = (event) => {
      if (event.lengthComputable) onProgress(event.loaded / event.total, event.loaded);
    };
    request.upload.onload = () => onProgress(1, file.size, true);
    request.onload = () => {
      let body = null;
      try { body = JSON.parse(request.responseText); } catch { body = request.responseText; }
      if (request.status >= 200 && request.status < 300) resolve(body);
      else reject(refused(request.status, body));
    };
    request.onerror = () => reject(new Error('the connection to the API was lost'));
    request.send(file);
  });
}

/** One bar per class, as wide as its share of the rows. */
function balance(dataset) {
  const total = dataset.class_counts.reduce((sum, count) => sum + count, 0) || 1;
  return h('ul.balance', { 'aria-label': 'Class balance' },
    dataset.labels.map((label, index) => {
      const count = dataset.class_counts[index];
      return h('li', {},
        h('span.label', {}, label),
        h('span.bar', { style: `--share: ${(100 * count) / total}%` }),
        h('span.num.small', {}, `${count} (${Math.round((100 * count) / total)}%)`));
    }));
}

function preview(dataset) {
  return h('div.table-wrap', {}, h('table.preview', {},
    h('thead', {}, h('tr', {}, h('th', {}, 'Label'), h('th', {}, 'Text'))),
    h('tbody', {}, dataset.preview.map((row) => h('tr', {},
      h('td', {}, row.label), h('td', {}, row.text))))));
}

function details(dataset) {
  return h('section.card.dataset', { dataset: { dataset: dataset.id } },
    h('h2', {}, dataset.name, ' ', h('span.muted.mono.small', {}, dataset.id)),
    h('p.small', {}, `${dataset.rows} rows (${dataset.format}; text column `
      + `“${dataset.text_column}”, label column “${dataset.label_column}”); dropped `
      + `${dataset.duplicates} duplicate and ${dataset.empty} empty.`),
    balance(dataset),
    h('h2', {}, 'First rows'),
    preview(dataset),
    h('p.small', {}, 'Train on it: ', h('a', { href: `#/new?dataset=${encodeURIComponent(dataset.id)}` },
      'new job with this dataset'), '.'));
}

function uploader(onDone) {
  const input = h('input#dataset-file', { type: 'file', accept: ACCEPT, hidden: true });
  const text = h('input#text-column', { name: 'text_column', placeholder: 'text, review, …' });
  const label = h('input#label-column', { name: 'label_column', placeholder: 'label, sentiment, …' });
  const bar = h('progress', { max: 1, value: 0, hidden: true, 'aria-label': 'Upload' });
  const status = h('p.notice', { role: 'status' });
  const zone = h('div.drop-zone', { tabindex: 0, role: 'button', 'aria-controls': 'dataset-file' },
    h('strong', {}, 'Drop a CSV, TSV, JSONL or Parquet file here'), ' or click to choose one.');
  let busy = false;

  async function send(file) {
    if (busy || !file) return;
    busy = true;
    bar.hidden = false;
    bar.value = 0;
    const params = {};
    if (text.value.trim()) params.text_column = text.value.trim();
    if (label.value.trim()) params.label_column = label.value.trim();
    try {
      const dataset = await upload(file, params, (share, sent, done) => {
        bar.value = share;
        notice(status, done ? `Checking ${file.name}…`
          : `Uploading ${file.name}: ${bytes(sent)} of ${bytes(file.size)}`);
      });
      notice(status, `${dataset.name}: ${dataset.rows} rows, ${dataset.labels.length} classes.`);
      onDone(dataset);
    } catch (error) {
      if (!error.unauthorized) notice(status, `${file.name} was not kept: ${error.message}`, 'error');
    } finally {
      busy = false;
      bar.hidden = true;
      input.value = '';
    }
  }

  zone.addEventListener('click', () => input.click());
  zone.addEventListener('keydown', (event) => {
    if (event.key === 'Enter' || event.key === ' ') { event.preventDefault(); input.click(); }
  });
  zone.addEventListener('dragover', (event) => { event.preventDefault(); zone.classList.add('over'); });
  zone.addEventListener('dragleave', () => zone.classList.remove('over'));
  zone.addEventListener('drop', (event) => {
    event.preventDefault();
    zone.classList.remove('over');
    send(event.dataTransfer.files[0]);
  });
  input.addEventListener('change', () => send(input.files[0]));
  return h('section.card.upload', {},
    h('h2', {}, 'Upload a dataset'),
    zone, input,
    h('div.columns', {},
      h('label', { for: 'text-column' }, 'Text column'), text,
      h('label', { for: 'label-column' }, 'Label column'), label),
    bar, status);
}

function datasetRow(dataset, onDelete) {
  const remove = h('button.small.danger', { type: 'button' }, 'Delete');
  remove.addEventListener('click', () => onDelete(dataset));
  return h('tr', { dataset: { dataset: dataset.id } },
    h('td', {}, h('a', { href: `#/datasets/${encodeURIComponent(dataset.id)}` }, dataset.name),
      h('br'), h('span.muted.mono', {}, dataset.id)),
    h('td.num', {}, String(dataset.rows)),
    h('td', {}, dataset.labels.map((name, index) => `${name} ${dataset.class_counts[index]}`).join(' · ')),
    h('td.num', {}, bytes(dataset.size_bytes)),
    h('td', {}, ago(dataset.created_at)),
    h('td', {}, remove));
}

export function showDatasets(main) {
  const body = h('tbody');
  const status = h('p.notice', { role: 'status' });
  const empty = h('p.muted', { hidden: true }, 'No datasets yet: upload one above.');
  const shown = h('div');
  const stagings = stagingsSection({ title: 'Hub models and datasets staged for jobs' });
  let stopped = false;

  async function refresh() {
    try {
      const page = await api('/api/v1/datasets?limit=200');
      if (stopped) return;
      fill(body, ...page.data.map((dataset) => datasetRow(dataset, remove)));
      empty.hidden = page.data.length > 0;
    } catch (error) {
      if (!stopped && !error.unauthorized) notice(status, `Could not list the datasets: ${error.message}`, 'error');
    }
  }

  async function remove(dataset) {
    if (!await confirmDialog('Delete dataset', `Delete ${dataset.name} (${dataset.id})?`, 'Delete')) return;
    try {
      await api(`/api/v1/datasets/${encodeURIComponent(dataset.id)}`, { method: 'DELETE' });
      notice(status, `Deleted ${dataset.name}.`);
      refresh();
    } catch (error) {
      if (!error.unauthorized) notice(status, error.message, 'error');
    }
  }

  fill(main, h('div.title-row', {}, h('h1', {}, 'Datasets')),
    uploader((dataset) => { fill(shown, details(dataset)); refresh(); }),
    shown, status,
    h('div.table-wrap', {}, h('table.datasets', {},
      h('thead', {}, h('tr', {}, h('th', {}, 'Name'), h('th.num', {}, 'Rows'),
        h('th', {}, 'Classes'), h('th.num', {}, 'Size'), h('th', {}, 'Uploaded'), h('th', {}))),
      body)),
    empty, stagings.section);
  document.title = 'Datasets · Live Migrator';
  refresh();
  return () => { stopped = true; stagings.stop(); };
}

export function showDataset(main, datasetId) {
  const status = h('p.notice', { role: 'status' });
  fill(main, h('div.title-row', {}, h('h1', {}, datasetId), h('a', { href: '#/datasets' }, 'All datasets')),
    status);
  let stopped = false;
  api(`/api/v1/datasets/${encodeURIComponent(datasetId)}`).then((dataset) => {
    if (stopped) return;
    setText(main.querySelector('h1'), dataset.name);
    main.append(details(dataset));
    document.title = `${dataset.name} · Live Migrator`;
  }).catch((error) => {
    if (!stopped && !error.unauthorized) notice(status, error.message, 'error');
  });
  return () => { stopped = true; };
}

/** The uploaded datasets as choices for a text input (a datalist: any other name still goes). */
export async function offerDatasets(input) {
  const page = await api('/api/v1/datasets?limit=200');
  offerChoices(input, page.data.map((dataset) => h('option', { value: dataset.id },
    `${dataset.name} (${dataset.rows} rows, ${dataset.labels.length} classes)`)));
}
