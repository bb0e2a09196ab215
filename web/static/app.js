// Entry point: log in with the token, route between the jobs list, the new-job form and a job.
import { adoptLogin, forgetToken, saveToken } from './api.js';
import { showBaseModels } from './base-models.js';
import { showDataset, showDatasets } from './datasets.js';
import { fill, h } from './dom.js';
import { showJob } from './job.js';
import { showJobs, showNewJob } from './jobs.js';
import { state } from './state.js';

const main = document.getElementById('main');
const logout = document.getElementById('logout');

function leaveView() {
  if (state.leave) state.leave();
  state.leave = null;
}

function route() {
  leaveView();
  const path = location.hash.replace(/^#/, '') || '/';
  const job = path.match(/^\/jobs\/([^/]+)$/);
  const dataset = path.match(/^\/datasets\/([^/]+)$/);
  const [page, query] = path.split('?');
  if (job) state.leave = showJob(main, decodeURIComponent(job[1]));
  else if (dataset) state.leave = showDataset(main, decodeURIComponent(dataset[1]));
  else if (path === '/datasets') state.leave = showDatasets(main);
  else if (path === '/models/base') state.leave = showBaseModels(main);
  else if (page === '/new') state.leave = showNewJob(main, new URLSearchParams(query ?? ''));
  else state.leave = showJobs(main);
}

function showLogin(message) {
  leaveView();
  logout.hidden = true;
  const input = h('input#token', {
    type: 'password', name: 'token', autocomplete: 'current-password', required: true,
    'aria-describedby': 'login-message',
  });
  const form = h('form.card.login', {
    on: {
      submit: (event) => {
        event.preventDefault();
        saveToken(input.value.trim());
        start();
      },
    },
  },
  h('h1', {}, 'Log in'),
  h('p#login-message', { role: 'alert' }, message),
  h('label', { for: 'token' }, 'Admin token'),
  input,
  h('div.actions', {}, h('button.primary', { type: 'submit' }, 'Log in')));
  fill(main, form);
  input.focus();
}

function start() {
  if (!state.token) {
    showLogin('Open the login URL printed when the control plane started (…/#login=…: it '
      + 'works once; `migrator login-url` prints a new one), or paste the admin token here.');
    return;
  }
  // No separate check: the view's first request answers 401/403 for a bad token, and the
  // 'unauthorized' listener below then replaces the view with the login prompt.
  logout.hidden = false;
  route();
}

window.addEventListener('unauthorized', (event) => {
  if (!state.token) return; // several requests of a view failed: one prompt is enough
  forgetToken();
  showLogin(`The token was refused (HTTP ${event.detail.status}): open a new login URL `
    + '(`migrator login-url`), or paste the admin token.');
});

/** Log in with a login URL's code, if the address has one, then start. */
async function logIn() {
  const refused = await adoptLogin();
  if (refused) showLogin(`The login URL was refused: ${refused}. Open a new one, or paste the admin token.`);
  else start();
}

window.addEventListener('hashchange', () => {
  if (location.hash.startsWith('#login=')) logIn(); // a login URL pasted into an open page
  else if (state.token) route();
});
logout.addEventListener('click', () => {
  forgetToken();
  showLogin('Logged out. Paste the admin token to log in again.');
});

logIn();
