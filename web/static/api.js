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
  if (!response.ok) {
    const error = new ApiError(response.status, data);
    if (error.unauthorized) window.dispatchEvent(new CustomEvent('unauthorized', { detail: error }));
    throw error;
  }
  return data;
}

/** A stream URL that carries the token itself: an EventSource cannot set headers. */
export function withToken(path, params = {}) {
  const url = new URL(path, location.origin);
  for (const [key, value] of Object.entries(params)) url.searchParams.set(key, value);
  url.searchParams.set('token', state.token ?? '');
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

/** Move a `?token=` of the login URL into sessionStorage and out of the address bar. */
export function adoptToken() {
  const url = new URL(location.href);
  const given = url.searchParams.get('token');
  if (given !== null) {
    sessionStorage.setItem(TOKEN_KEY, given);
    url.searchParams.delete('token');
    history.replaceState(history.state, '', url.pathname + url.search + url.hash);
  }
  state.token = sessionStorage.getItem(TOKEN_KEY);
  return state.token;
}

export function saveToken(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
  state.token = token;
}

export function forgetToken() {
  sessionStorage.removeItem(TOKEN_KEY);
  state.token = null;
}
