// Base models: the hub models staged for jobs (their progress, an import form, Delete), and the
// new-job form's choices for its model field.
import { api } from './api.js';
import { STAGING_STATUS } from './contract.js';
import { fill, h, offerChoices } from './dom.js';
import { stagingsSection } from './stagings.js';

export function showBaseModels(main) {
  const stagings = stagingsSection({
    kind: 'model',
    title: 'Hub models staged for jobs',
    empty: 'No hub model staged yet: import one above, or start a job that names one.',
  });
  fill(main, h('div.title-row', {}, h('h1', {}, 'Base models')),
    h('p.small', {}, 'A job fine-tunes the offline model ', h('span.mono', {}, 'minilm'),
      ', a model directory under the inputs dir, or a hub model staged here first (a job ',
      'naming one that is not stages it while it prepares).'),
    stagings.section);
  document.title = 'Base models · Live Migrator';
  return stagings.stop;
}

/**
 * The offline model and the staged hub models as choices for a text input (a datalist: a
 * local model directory or any other hub id still goes).
 */
export async function offerModels(input, offline) {
  const page = await api('/api/v1/stagings?kind=model&limit=200');
  const revisions = new Map();
  for (const staging of page.data) {
    if (staging.status !== STAGING_STATUS.succeeded) continue;
    revisions.set(staging.repo_id, [...(revisions.get(staging.repo_id) ?? []), staging.revision]);
  }
  offerChoices(input, [
    offline ? h('option', { value: offline }, 'offline, needs no hub') : null,
    ...[...revisions].map(([repo, staged]) => h('option', { value: repo }, `staged: ${staged.join(', ')}`))]);
}
