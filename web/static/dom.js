// DOM building and formatting. Text always goes through textContent: nothing user-supplied is
// ever parsed as HTML.

/** h('tag.class#id', {attrs, on: {event: fn}}, ...children): children are nodes or text. */
export function h(spec, attrs = {}, ...children) {
  const [tagAndClasses, id] = spec.split('#');
  const [tag, ...classes] = tagAndClasses.split('.');
  const element = document.createElement(tag || 'div');
  if (id) element.id = id;
  if (classes.length) element.className = classes.join(' ');
  for (const [key, value] of Object.entries(attrs ?? {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'on') {
      for (const [event, handler] of Object.entries(value)) element.addEventListener(event, handler);
    } else if (key === 'dataset') {
      Object.assign(element.dataset, value);
    } else if (key in element && typeof value !== 'string') {
      element[key] = value;
    } else {
      element.setAttribute(key, value === true ? '' : String(value));
    }
  }
  append(element, children);
  return element;
}

function append(element, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replace an element's content (nodes or text). */
export function fill(element, ...children) {
  element.replaceChildren();
  append(element, children);
  return element;
}

/** Set text only when it changed (keeps live updates from touching the DOM needlessly). */
export function setText(element, text) {
  const value = String(text ?? '');
  if (element.textContent !== value) element.textContent = value;
}

export function badge(status) {
  return h('span.badge', { dataset: { status: String(status).toLowerCase() } }, status);
}

export function setBadge(element, status) {
  const value = String(status);
  setText(element, value);
  element.dataset.status = value.toLowerCase();
}

const units = [['d', 86400], ['h', 3600], ['min', 60], ['s', 1]];

export function duration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return '–';
  if (seconds < 1) return `${Math.max(seconds, 0).toFixed(1)} s`;
  if (seconds < 60) return `${Math.round(seconds)} s`;
  const parts = [];
  let rest = Math.round(seconds);
  for (const [unit, size] of units) {
    if (rest >= size && parts.length < 2) {
      parts.push(`${Math.floor(rest / size)} ${unit}`);
      rest %= size;
    }
  }
  return parts.join(' ');
}

/** "12 s ago" for an ISO time or unix seconds; "–" when missing. */
export function ago(time) {
  if (time === null || time === undefined) return '–';
  const ms = typeof time === 'number' ? time * 1000 : Date.parse(time);
  if (!Number.isFinite(ms)) return '–';
  return `${duration(Math.max(0, (Date.now() - ms) / 1000))} ago`;
}

export function clock(unixSeconds) {
  return new Date(unixSeconds * 1000).toLocaleTimeString([], { hour12: false });
}

export function bytes(size) {
  if (size === null || size === undefined) return '–';
  const names = ['B', 'KB', 'MB', 'GB', 'TB'];
  let value = size, index = 0;
  while (value >= 1024 && index < names.length - 1) { value /= 1024; index += 1; }
  return `${value.toFixed(index ? 1 : 0)} ${names[index]}`;
}

export function number(value, digits = 3) {
  if (value === null || value === undefined || !Number.isFinite(Number(value))) return '–';
  return Number(value).toLocaleString([], { maximumFractionDigits: digits });
}

export function percent(value) {
  return value === null || value === undefined ? '–' : `${(100 * value).toFixed(1)}%`;
}

/** A live region for short messages (errors of actions, confirmations). */
export function notice(element, message, kind = 'info') {
  element.dataset.kind = kind;
  setText(element, message);
}

/** The confirm dialog of index.html; resolves true when the user confirms. */
export function confirmDialog(title, text, okLabel) {
  const dialog = document.getElementById('confirm');
  setText(document.getElementById('confirm-title'), title);
  setText(document.getElementById('confirm-text'), text);
  setText(document.getElementById('confirm-ok'), okLabel);
  dialog.returnValue = '';
  return new Promise((resolve) => {
    dialog.addEventListener('close', () => resolve(dialog.returnValue === 'ok'), { once: true });
    dialog.showModal();
  });
}

/** Offer `options` (<option> elements) as a text input's choices: a datalist, any value still goes. */
export function offerChoices(input, options) {
  const list = h('datalist', { id: `${input.id}-choices` }, options);
  input.after(list);
  input.setAttribute('list', list.id);
}
