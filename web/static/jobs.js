// The jobs list (polled) and the new-job form (built from the API's JobCreate schema).
import { api } from './api.js';
import { offerModels } from './base-models.js';
import { offerDatasets } from './datasets.js';
import { JOB_STATUS, PARALLELISM, POD_PHASE } from './contract.js';
import { ago, badge, fill, h, notice, percent, setBadge, setText } from './dom.js';
import { state } from './state.js';

const POLL_MS = 2000;

export function progressOf(job) {
  const { progress } = job;
  if (job.status === JOB_STATUS.succeeded) return 1;
  if (progress.total_samples) return Math.min(progress.samples_seen / progress.total_samples, 1);
  return progress.epochs ? Math.min((progress.epoch - 1) / progress.epochs, 1) || 0 : 0;
}

export function accuracyOf(job) {
  const { metrics } = job;
  if (metrics.test_accuracy !== undefined) return `${percent(metrics.test_accuracy)} test`;
  if (metrics.val_accuracy !== undefined) return `${percent(metrics.val_accuracy)} val`;
  return '–';
}

/** Pods a job runs: replicas x stages (a data-parallel job has one stage). */
export function podsOf(spec) {
  return spec.replicas * (spec.parallelism === PARALLELISM.pipeline ? spec.pipeline_stages : 1);
}

export function aliveOf(job) {
  const alive = job.pods.filter((pod) => pod.phase === POD_PHASE.Running).length;
  return `${alive}/${podsOf(job.spec)}`;
}

function jobRow(job) {
  const cells = {
    name: h('a', { href: `#/jobs/${encodeURIComponent(job.id)}` }),
    id: h('span.muted.mono'),
    status: badge(job.status),
    alive: h('td.num'),
    bar: h('progress', { max: 1, value: 0 }),
    label: h('span.small'),
    accuracy: h('td.num'),
    age: h('td'),
  };
  const row = h('tr', { dataset: { job: job.id } },
    h('td', {}, cells.name, h('br'), cells.id),
    h('td', {}, cells.status),
    cells.alive,
    h('td.progress-cell', {}, cells.bar, cells.label),
    cells.accuracy,
    cells.age);
  row.cells_ = cells;
  return row;
}

function updateRow(row, job) {
  const cells = row.cells_;
  setText(cells.name, job.name || job.id);
  setText(cells.id, job.name ? job.id : '');
  setBadge(cells.status, job.status);
  setText(cells.alive, aliveOf(job));
  const done = progressOf(job);
  cells.bar.value = done;
  cells.bar.setAttribute('aria-label', `${Math.round(done * 100)}% done`);
  const { progress } = job;
  setText(cells.label, `epoch ${progress.epoch}/${progress.epochs} · step ${progress.step}`);
  setText(cells.accuracy, accuracyOf(job));
  setText(cells.age, ago(job.created_at));
}

export function showJobs(main) {
  const body = h('tbody');
  const empty = h('p.muted', { hidden: true }, 'No jobs yet. ',
    h('a', { href: '#/new' }, 'Start one'), '.');
  const status = h('p.notice', { role: 'status' });
  fill(main,
    h('div.title-row', {}, h('h1', {}, 'Jobs'), h('a.button.primary', { href: '#/new' }, 'New job')),
    status,
    h('div.table-wrap', {}, h('table.jobs', {},
      h('thead', {}, h('tr', {}, h('th', {}, 'Name'), h('th', {}, 'Status'),
        h('th.num', { title: 'Pods running / pods asked' }, 'Pods'), h('th', {}, 'Progress'),
        h('th.num', {}, 'Accuracy'), h('th', {}, 'Age'))),
      body)),
    empty);
  document.title = 'Jobs · Live Migrator';
  const rows = new Map();
  let timer = null;
  let stopped = false;

  async function poll() {
    try {
      const page = await api('/api/v1/jobs?limit=200');
      if (stopped) return;
      state.jobs = new Map(page.data.map((job) => [job.id, job]));
      page.data.forEach((job, index) => {
        let row = rows.get(job.id);
        if (!row) { row = jobRow(job); rows.set(job.id, row); }
        updateRow(row, job);
        if (body.children[index] !== row) body.insertBefore(row, body.children[index] ?? null);
      });
      for (const [id, row] of rows) {
        if (!state.jobs.has(id)) { row.remove(); rows.delete(id); }
      }
      empty.hidden = page.data.length > 0;
      notice(status, '');
    } catch (error) {
      if (stopped || error.unauthorized) return;
      notice(status, `Could not refresh the jobs: ${error.message}`, 'error');
    }
    if (!stopped) timer = setTimeout(poll, POLL_MS);
  }
  poll();
  return () => { stopped = true; clearTimeout(timer); };
}

// --- new-job form -------------------------------------------------------------------------

async function jobSchema() {
  if (!state.jobSchema) {
    const response = await fetch('/openapi.json');
    if (!response.ok) throw new Error(`/openapi.json: HTTP ${response.status}`);
    const { schemas } = (await response.json()).components;
    state.jobSchema = { ...schemas.JobCreate, schemas };
  }
  return state.jobSchema;
}

/** The field's choices, kind and bounds, whether it is optional (nullable) or not. */
function describe(property) {
  const options = property.anyOf ?? [property];
  const nullable = options.some((option) => option.type === 'null');
  const real = options.filter((option) => option.type !== 'null');
  const choices = real.flatMap((option) => option.enum ?? (option.const !== undefined ? [option.const] : []));
  const base = real[0] ?? {};
  return { nullable, choices, type: base.type ?? 'string', base };
}

/** The object schema a property holds (`lora`, `resources`), or null for a plain value. */
function objectOf(property, schemas) {
  const ref = [property, ...(property.anyOf ?? [])].map((option) => option.$ref).find(Boolean);
  const target = ref ? schemas[ref.split('/').pop()] : null;
  return target?.properties ? target : null;
}

/** A nested object's fields, named `parent.child`. Only those the user changes are sent: the
 * server fills in the rest, and an untouched group is left out. */
function group(name, property, target) {
  const defaults = property.default ?? {};
  const hint = property.description;
  const children = Object.entries(target.properties).map(([child, schema]) =>
    field(`${name}.${child}`, { ...schema, default: defaults[child] ?? schema.default }));
  return h('fieldset.field.group', { dataset: { field: name } },
    h('legend', {}, name),
    hint ? h('p.hint', {}, hint) : null,
    children,
    h('p.field-error', { role: 'alert' }));
}

function field(name, property) {
  const { nullable, choices, type, base } = describe(property);
  const id = `field-${name}`;
  const hint = property.description ?? base.description;
  const described = [`${id}-error`, hint ? `${id}-hint` : null].filter(Boolean).join(' ');
  let input;
  if (choices.length) {
    input = h('select', { id, name, 'aria-describedby': described },
      nullable ? h('option', { value: '' }, '(none)') : null,
      choices.map((choice) => h('option', { value: String(choice) }, String(choice))));
    input.value = property.default === null || property.default === undefined ? '' : String(property.default);
  } else {
    const numeric = type === 'integer' || type === 'number';
    input = h('input', {
      id, name, type: numeric ? 'number' : 'text', 'aria-describedby': described,
      step: type === 'integer' ? '1' : numeric ? 'any' : undefined,
      min: base.minimum ?? undefined, max: base.maximum ?? undefined,
      placeholder: nullable ? 'optional' : undefined,
    });
    const initial = property.default;
    if (initial !== null && initial !== undefined) {
      input.value = Array.isArray(initial) ? initial.join(', ') : String(initial);
    }
  }
  input.dataset.kind = choices.length ? 'choice' : type;
  input.dataset.initial = input.value;
  const label = property.title ?? name;
  return h('div.field', { dataset: { field: name } },
    h('label', { for: id }, label),
    input,
    hint ? h('p.hint', { id: `${id}-hint` }, hint) : null,
    h('p.field-error', { id: `${id}-error`, role: 'alert' }));
}

function valuesOf(form) {
  const spec = {};
  for (const input of form.querySelectorAll('input, select')) {
    const raw = input.value.trim();
    if (raw === '') continue; // optional fields left empty keep the server's default
    const [name, child] = input.name.split('.');
    if (child !== undefined && raw === input.dataset.initial.trim()) continue;
    const kind = input.dataset.kind;
    const numeric = (kind === 'integer' || kind === 'number') && Number.isFinite(Number(raw));
    const value = kind === 'array' ? raw.split(',').map((item) => item.trim()).filter(Boolean)
      : numeric ? Number(raw) : raw;
    if (child === undefined) spec[name] = value;
    else spec[name] = { ...spec[name], [child]: value };
  }
  return spec;
}

function showErrors(form, general, detail) {
  let first = null;
  const unplaced = [];
  for (const problem of Array.isArray(detail) ? detail : [{ msg: String(detail) }]) {
    const loc = problem.loc ?? [];
    const name = loc[0] === 'body' ? loc[1] : undefined;
    // A nested field's own box (`lora.r`), else its group's.
    const names = [loc.slice(1, 3).join('.'), name].filter((candidate) => candidate !== undefined);
    const box = names.map((candidate) => form.querySelector(
      `[data-field="${CSS.escape(String(candidate))}"]`)).find(Boolean) ?? null;
    if (!box) { unplaced.push(problem.msg); continue; }
    setText(box.querySelector('.field-error'), problem.msg);
    const input = box.querySelector('input, select');
    input.setAttribute('aria-invalid', 'true');
    first ??= input;
  }
  notice(general, unplaced.length ? unplaced.join('; ') : 'Please correct the highlighted fields.', 'error');
  first?.focus();
}

function clearErrors(form) {
  for (const error of form.querySelectorAll('.field-error')) setText(error, '');
  for (const input of form.querySelectorAll('[aria-invalid]')) input.removeAttribute('aria-invalid');
}

/** The new-job form; `params` fill in its fields (`#/new?dataset=ds-...`, `?model=org/name`). */
export function showNewJob(main, params = new URLSearchParams()) {
  const general = h('p.notice', { role: 'status' });
  const fields = h('div.fields');
  const submit = h('button.primary', { type: 'submit' }, 'Start job');
  const form = h('form.card.new-job', { novalidate: true }, fields, general,
    h('div.actions', {}, h('a.button', { href: '#/' }, 'Cancel'), submit));
  fill(main, h('div.title-row', {}, h('h1', {}, 'New job')), form);
  document.title = 'New job · Live Migrator';
  let stopped = false;

  jobSchema().then((schema) => {
    if (stopped) return;
    for (const [name, property] of Object.entries(schema.properties)) {
      const target = objectOf(property, schema.schemas);
      fields.append(target ? group(name, property, target) : field(name, property));
    }
    for (const [name, value] of params) {
      const input = fields.querySelector(`[name="${CSS.escape(name)}"]`);
      if (input) input.value = value;
    }
    // The fields take any name without their choices.
    const dataset = fields.querySelector('[name="dataset"]');
    if (dataset) offerDatasets(dataset).catch(() => {});
    const model = fields.querySelector('[name="model"]');
    if (model) offerModels(model, schema.properties.model.default).catch(() => {});
    fields.querySelector('input, select')?.focus();
  }).catch((error) => notice(general, `Could not load the job schema: ${error.message}`, 'error'));

  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    clearErrors(form);
    submit.disabled = true;
    notice(general, 'Starting…');
    try {
      const job = await api('/api/v1/jobs', { method: 'POST', body: valuesOf(form) });
      if (!stopped) location.hash = `#/jobs/${encodeURIComponent(job.id)}`;
    } catch (error) {
      if (stopped || error.unauthorized) return;
      if (error.status === 422) showErrors(form, general, error.detail);
      else notice(general, `The job was not started: ${error.message}`, 'error');
    } finally {
      submit.disabled = false;
    }
  });
  return () => { stopped = true; };
}
