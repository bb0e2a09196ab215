// A finished job's result (test metrics, model download, try-it box) and the checkpoints table.
import { api, download } from './api.js';
import { JOB_STATUS } from './contract.js';
import { bytes, clock, fill, h, notice, number, percent } from './dom.js';

/** A download anchor that fetches a signed link when clicked (`links.download_link`). */
function downloadLink(links, filename, label, tag = 'a') {
  const anchor = h(tag, {
    href: links.download, download: filename,
    on: {
      click: (event) => {
        event.preventDefault();
        download(links.download_link, filename).catch((error) => {
          if (!error.unauthorized) anchor.title = `Download failed: ${error.message}`;
        });
      },
    },
  }, label);
  return anchor;
}

export class Checkpoints {
  constructor(body, empty) {
    this.body = body;
    this.empty = empty;
    this.timer = null;
  }

  /** Refresh soon; several checkpoint events in a row cost one request. */
  refreshSoon(jobId, delay = 800) {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.refresh(jobId), delay);
  }

  async refresh(jobId) {
    let checkpoints;
    try {
      checkpoints = await api(`/api/v1/jobs/${encodeURIComponent(jobId)}/checkpoints`);
    } catch {
      return; // shown again on the next checkpoint event; auth errors show the login
    }
    this.empty.hidden = checkpoints.length > 0;
    fill(this.body, checkpoints.map((c) => h('tr', { dataset: { checkpoint: c.id } },
      h('td.mono', {}, c.id),
      h('td.num', {}, c.epoch ?? '–', c.epoch_end ? ' (end)' : ''),
      h('td.num', {}, String(c.step)),
      h('td.num', {}, c.val_accuracy === null ? '–' : percent(c.val_accuracy)),
      h('td.num', {}, bytes(c.size_bytes)),
      h('td', {}, c.saved_at ? clock(c.saved_at) : '–'),
      h('td', {}, downloadLink(c.links, `${jobId}-${c.id}.tar.gz`, 'Download')))));
  }

  stop() { clearTimeout(this.timer); }
}

export class Result {
  constructor(section) {
    this.section = section;
    this.shown = null;
  }

  async show(job) {
    if (job.status !== JOB_STATUS.succeeded || !job.model_id || this.shown === job.model_id) return;
    this.shown = job.model_id;
    let model;
    try {
      model = await api(`/api/v1/models/${encodeURIComponent(job.model_id)}`);
    } catch (error) {
      this.shown = null;
      return;
    }
    const metrics = { ...job.metrics, ...Object.fromEntries(Object.entries(model.metrics?.test ?? {})
      .map(([key, value]) => [`test_${key}`, value])) };
    const text = h('textarea#try-text', { rows: 3, maxlength: 20000 }, 'A warm, clever and moving film.');
    const output = h('output#try-output', { for: 'try-text', 'aria-live': 'polite' });
    const button = h('button.primary', { type: 'submit' }, 'Classify');
    const form = h('form.try', {
      on: {
        submit: async (event) => {
          event.preventDefault();
          button.disabled = true;
          output.textContent = 'Classifying…';
          try {
            const answer = await api(`/api/v1/models/${encodeURIComponent(model.id)}/predict`,
              { method: 'POST', body: { texts: [text.value] } });
            const [prediction] = answer.predictions;
            output.dataset.label = prediction.label;
            fill(output, h('span.badge', { dataset: { status: prediction.label } }, prediction.label),
              ` score ${number(prediction.score, 3)}`);
          } catch (error) {
            if (!error.unauthorized) notice(output, `No prediction: ${error.message}`, 'error');
          } finally {
            button.disabled = false;
          }
        },
      },
    },
    h('label', { for: 'try-text' }, 'Try it: text to classify'), text,
    h('div.actions', {}, button, output));
    fill(this.section,
      h('h2', {}, 'Result'),
      h('dl.stats', {},
        h('div', {}, h('dt', {}, 'Test accuracy'), h('dd#test-accuracy', {}, percent(metrics.test_accuracy))),
        h('div', {}, h('dt', {}, 'Test F1'), h('dd', {}, number(metrics.test_f1))),
        h('div', {}, h('dt', {}, 'Test loss'), h('dd', {}, number(metrics.test_loss))),
        h('div', {}, h('dt', {}, 'Model'), h('dd.mono', {}, model.id))),
      h('p', {}, downloadLink(model.links, `${model.id}.tar.gz`,
        `Download model (${bytes(model.size_bytes)}, .tar.gz)`, 'a.button#model-download'),
      ' ', h('span.small.muted', {}, 'loads with AutoModelForSequenceClassification.from_pretrained')),
      form);
    this.section.hidden = false;
  }
}
