// The one way to reach the API: bearer token, JSON in and out, errors thrown.
import { state } from './state.js';

const TOKEN_KEY = 'migrator.token';

/** What a person reads of an error's detail: its text, or the messages of a 422's list. */
function messageOf(status, detail) {
  if (typeof detail === 'string') return detail;
  const messages = Array.isArray(detail) ? detail.map((d) => d?.msg).filter(Boolean) : [];
  return messages.length ? messages.join('; ') : `HTTP ${status}`;
}

export class ApiError extends Error {
  constructor(status, body) {
    const detail = body && body.detail !== undefined ? body.detail : body;
    super(messageOf(status, detail));
    this.status = status;
    this.detail = detail;
  }

  get unauthorized() { return this.status === 401 || this.status === 403; }
}

export async function api(path, { method = 'GET', body, signal } = {}) {
  const headers = { Accept: 'application/json' };
  if (state.token) headers.Authorization = `Bearer ${state.token}`;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const response = await fetch(path, {
    method, headers, signal, body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = text; }
  if (!response.ok) throw refused(response.status, data);
  return data;
}

/** The error of an answer that is not a success; a refused token also tells the page. */
export function refused(status, body) {
  const error = new ApiError(status, body);
  if (error.unauthorized) window.dispatchEvent(new CustomEvent('unauthorized', { detail: error }));
  return error;
}

/**
 * The job's event stream as a signed link (`POST .../stream-link`), since an EventSource cannot
 * send the token as a header: no URL carries the token. A link opens a stream within a minute;
 * the stream then goes on for as long as it stays open, and every reconnect asks for a new link.
 */
export async function streamUrl(jobId, params = {}) {
  const link = await api(`/api/v1/jobs/${encodeURIComponent(jobId)}/stream-link`, { method: 'POST' });
  const url = new URL(link.url, location.origin);
  for (const [key, value] of Object.entries(params)) url.searchParams.set(key, value);
  return url.pathname + url.search;
}

/**
 * Download through a signed link (`POST linkPath` answers `{url, expires_at}`), so the token
 * never sits in a URL or the browser's history.
 */
export async function download(linkPath, filename) {
  const link = await api(linkPath, { method: 'POST' });
  const anchor = document.createElement('a');
  anchor.href = link.url;
  anchor.download = filename;
  anchor.hidden = true;
  document.body.append(anchor);
  anchor.click();
  anchor.remove();
}

/**
 * Log in with the login URL's code (`/#login=CODE`: a fragment, which the browser sends to no
 * server). The code leaves the address bar and the history at once, then buys the token once
 * with a POST; the token stays in this tab's session storage (a login URL replaces the tab's
 * login). Resolves to why the code was refused, or null.
 */
export async function adoptLogin() {
  const code = location.hash.match(/^#login=([^&]+)$/)?.[1];
  if (code !== undefined) {
    history.replaceState(history.state, '', `${location.pathname}${location.search}#/`);
    forgetToken();
    try {
      const answer = await api('/api/v1/login', { method: 'POST', body: { code: decodeURIComponent(code) } });
      sessionStorage.setItem(TOKEN_KEY, answer.token);
    } catch (error) {
      return error.message;
    }
  }
  state.token = sessionStorage.getItem(TOKEN_KEY);
  return null;
}

export function saveToken(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
  state.token = token;
}

export function forgetToken() {
  sessionStorage.removeItem(TOKEN_KEY);
  state.token = null;
}
