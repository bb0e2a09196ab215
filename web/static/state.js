// The dashboard's one state object; views read and change it, nothing else holds data.
export const state = {
  /** Admin token (sessionStorage "migrator.token"); sent as a bearer header. */
  token: null,
  /** The current view's teardown (closes its stream, stops its timers). */
  leave: null,
  /** Jobs list: id -> JobPublic, from the last poll. */
  jobs: new Map(),
  /** The open job page (see job.js), or null. */
  job: null,
  /** Cached JobCreate schema from /openapi.json (the new-job form is built from it). */
  jobSchema: null,
};
