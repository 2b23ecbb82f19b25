// toolloop's web page: log in with a token, start requests, follow them live, decide their side effects.
// Plain JS, no build step, nothing fetched from anywhere but this API. Every piece of server data is
// rendered with textContent (tool results and arguments are untrusted text), never as HTML.
"use strict";

(() => {
  const TOKEN_KEY = "toolloop.token";
  const PAGE_SIZE = 20;
  // Browsers open about six HTTP/1.1 connections per host: a few live streams leave room for the rest
  // (an approval must never wait behind a stream). Requests beyond that are polled until a slot frees.
  const MAX_STREAMS = 3;
  const POLL_MS = 3000;
  // Reconnects in a row without receiving anything, before the page stops and offers a button.
  const MAX_RETRIES = 6;
  const MAX_LINE_BUFFER = 1 << 20;
  // How often the list of what waits for the caller's decision is read again (also after each decision and on
  // its Refresh button), while the tab is visible; only for a caller with roles, as only a role lets anyone
  // decide another person's writes.
  const DECISIONS_MS = 30000;
  const DECIDED_KEPT = 10;

  const $ = (id) => document.getElementById(id);

  let token = null;
  let me = null; // {user_id, tenant_id, roles} of the signed-in caller (GET /v1/me)
  let session = 0; // bumped on logout: work started under an older session stops
  let nextPageToken = null;
  const requests = new Map(); // request id -> Req
  let streamsInUse = 0;
  const streamQueue = []; // Reqs waiting for a stream slot (polled meanwhile)

  // --- Small helpers ---------------------------------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "text") node.textContent = String(value);
      else if (name === "className") node.className = value;
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function field(root, name) {
    return root.querySelector(`[data-field="${name}"]`);
  }

  function setText(node, text) {
    const value = text === null || text === undefined ? "" : String(text);
    if (node.textContent !== value) node.textContent = value;
  }

  function showError(node, text) {
    setText(node, text || "");
    node.hidden = !text;
  }

  function announce(text) {
    const node = $("announcer");
    node.textContent = "";
    // A fresh text node after a tick, so screen readers announce the same words twice too.
    setTimeout(() => { node.textContent = text; }, 50);
  }

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  function formatTime(iso) {
    if (!iso) return "";
    const date = new Date(iso);
    if (Number.isNaN(date.getTime())) return String(iso);
    return `${date.toLocaleString()} (${date.toISOString().replace(/\.\d+Z$/, "Z")})`;
  }

  function relative(iso) {
    const ms = new Date(iso).getTime() - Date.now();
    if (Number.isNaN(ms)) return "";
    const s = Math.round(Math.abs(ms) / 1000);
    const words = s >= 60 ? `${Math.floor(s / 60)} min ${s % 60} s` : `${s} s`;
    return ms >= 0 ? `in ${words}` : `${words} ago`;
  }

  // Invisible or look-alike characters (controls, format characters such as bidi overrides and zero-width
  // joiners, unusual spaces) are shown as \u escapes: what the approver reads is what will be sent.
  const HIDDEN_CHARS = /[\p{Cc}\p{Cf}\p{Co}\p{Cn}\p{Zl}\p{Zp}\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]/gu;

  function escapeHidden(text) {
    return text.replace(HIDDEN_CHARS, (ch) => {
      let out = "";
      for (let i = 0; i < ch.length; i += 1) out += "\\u" + ch.charCodeAt(i).toString(16).padStart(4, "0");
      return out;
    });
  }

  function hasHidden(text) {
    HIDDEN_CHARS.lastIndex = 0;
    const found = HIDDEN_CHARS.test(text);
    HIDDEN_CHARS.lastIndex = 0;
    return found;
  }

  // The same text as the server's canonical_json: sorted keys (by code point), no whitespace, UTF-8 as is.
  function byCodePoint(a, b) {
    const x = Array.from(a);
    const y = Array.from(b);
    for (let i = 0; i < Math.min(x.length, y.length); i += 1) {
      const d = x[i].codePointAt(0) - y[i].codePointAt(0);
      if (d !== 0) return d;
    }
    return x.length - y.length;
  }

  // A number inside a write's arguments, as the server wrote it. Parsed, 25.0 and 25 are one JS number and a
  // 20-digit integer loses digits, but the digest covers Python's text of each: an integer's digits, a float's
  // repr (25.0, 1e-07, 1e+16). JSON.parse hands the source text over where the browser can (`context.source`).
  class JsonNumber {
    constructor(source) {
      this.source = source;
    }

    get canonical() {
      return /[.eE]/.test(this.source) ? pythonFloat(Number(this.source)) : BigInt(this.source).toString();
    }

    toJSON() {
      return Number(this.source);
    }
  }

  function pythonFloat(x) {
    if (x === 0) return Object.is(x, -0) ? "-0.0" : "0.0";
    const [mantissa, power] = x.toExponential().split("e"); // the shortest digits that read back as x
    const exp = Number(power);
    const sign = mantissa.startsWith("-") ? "-" : "";
    const digits = mantissa.replace("-", "").replace(".", "");
    if (exp < -4 || exp >= 16) {
      const m = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
      return `${sign}${m}e${exp < 0 ? "-" : "+"}${String(Math.abs(exp)).padStart(2, "0")}`;
    }
    if (exp < 0) return `${sign}0.${"0".repeat(-exp - 1)}${digits}`;
    return `${sign}${digits.slice(0, exp + 1).padEnd(exp + 1, "0")}.${digits.slice(exp + 1) || "0"}`;
  }

  // JSON whose "arguments" keep each number's source text (JsonNumber); every other number stays a number. Where
  // the browser gives no source text, arguments' numbers stay numbers too, and the digest is not recomputed.
  function parseKeepingArgumentNumbers(text) {
    const kept = JSON.parse(text, (key, value, context) =>
      typeof value === "number" && context && typeof context.source === "string" ? new JsonNumber(context.source) : value,
    );
    const plain = (value, inArguments) => {
      if (value instanceof JsonNumber) return inArguments ? value : Number(value.source);
      if (Array.isArray(value)) return value.map((v) => plain(v, inArguments));
      if (value !== null && typeof value === "object") {
        return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, plain(v, inArguments || k === "arguments")]));
      }
      return value;
    };
    return plain(kept, false);
  }

  function hasPlainNumber(value) {
    if (typeof value === "number") return true;
    if (value instanceof JsonNumber || value === null || typeof value !== "object") return false;
    return Object.values(value).some(hasPlainNumber);
  }

  function canonicalJson(value) {
    if (value instanceof JsonNumber) return value.canonical;
    if (Array.isArray(value)) return "[" + value.map(canonicalJson).join(",") + "]";
    if (value !== null && typeof value === "object") {
      const keys = Object.keys(value).sort(byCodePoint);
      return "{" + keys.map((k) => JSON.stringify(k) + ":" + canonicalJson(value[k])).join(",") + "}";
    }
    return JSON.stringify(value);
  }

  async function payloadDigest(subject, args) {
    const text = canonicalJson({ tool: subject, arguments: args });
    const hash = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(text));
    return "sha256:" + Array.from(new Uint8Array(hash), (b) => b.toString(16).padStart(2, "0")).join("");
  }

  // --- HTTP ------------------------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, code, detail) {
      super(detail);
      this.status = status;
      this.code = code;
      this.detail = detail;
    }
  }

  function describe(error) {
    if (error instanceof ApiError) {
      return error.status ? `${error.detail} (${error.status} ${error.code})` : error.detail;
    }
    return String(error && error.message ? error.message : error);
  }

  // An event stream (a request's or a thread's), resumed after `lastEventId` when there is one.
  function fetchEvents(path, lastEventId, signal) {
    const headers = { Accept: "text/event-stream", Authorization: `Bearer ${token}` };
    if (lastEventId) headers["Last-Event-ID"] = lastEventId;
    return fetch(path, { headers, signal, cache: "no-store", credentials: "omit" });
  }

  async function api(path, { method = "GET", body, headers = {}, signal, quiet401 = false, exactArguments = false } = {}) {
    const mine = session;
    const sent = { Accept: "application/json", Authorization: `Bearer ${token}`, ...headers };
    if (body !== undefined) sent["Content-Type"] = "application/json";
    let response;
    try {
      response = await fetch(path, {
        method,
        headers: sent,
        body: body === undefined ? undefined : JSON.stringify(body),
        signal,
        cache: "no-store",
        credentials: "omit",
      });
    } catch (error) {
      if (error && error.name === "AbortError") throw error;
      throw new ApiError(0, "NETWORK", "cannot reach the API");
    }
    const text = await response.text();
    let data = null;
    try {
      data = text ? (exactArguments && response.ok ? parseKeepingArgumentNumbers(text) : JSON.parse(text)) : null;
    } catch {
      data = null;
    }
    if (!response.ok) {
      const detail = (data && typeof data.detail === "string" && data.detail) || response.statusText || "failed";
      const code = (data && typeof data.code === "string" && data.code) || `HTTP_${response.status}`;
      if (response.status === 401 && !quiet401 && mine === session) signedOut("Your token is no longer accepted: log in again.");
      throw new ApiError(response.status, code, detail);
    }
    return data;
  }

  const requestPath = (id) => `/v1/requests/${encodeURIComponent(id)}`;

  // What a failed decision says. Only a refusal (4xx) means it was not recorded: after a 5xx or a lost answer
  // Temporal may hold it and apply it still, so the page reads the operation again instead of saying "not".
  const refused = (error) => error instanceof ApiError && error.status >= 400 && error.status < 500;

  function decisionFailure(error) {
    return refused(error)
      ? `The decision was not recorded: ${describe(error)}`
      : `The decision may still be recorded (${describe(error)}): its state is read again before anything else.`;
  }

  // --- Server-sent events over fetch (EventSource cannot send an Authorization header) --------------------

  // Calls onEvent({id, type, data}) for each complete event and onChunk() after each chunk read; resolves when
  // the stream ends. Lines end with CRLF, LF or CR; a blank line ends an event; ":" lines are comments.
  async function readEventStream(body, onEvent, onChunk) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    let data = [];
    let type = "";
    let lastId = null;

    function line(text) {
      if (text === "") {
        if (data.length) onEvent({ id: lastId, type: type || "message", data: data.join("\n") });
        data = [];
        type = "";
        return;
      }
      if (text.startsWith(":")) return;
      const colon = text.indexOf(":");
      const name = colon === -1 ? text : text.slice(0, colon);
      let value = colon === -1 ? "" : text.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (name === "data") data.push(value);
      else if (name === "event") type = value;
      else if (name === "id" && !value.includes("\0")) lastId = value;
    }

    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) {
          // A CR held back in case an LF followed ends its line after all; an unfinished event is dropped.
          if (buffer.endsWith("\r")) line(buffer.slice(0, -1));
          if (buffer.length) onChunk();
          return;
        }
        buffer += value;
        let pos = 0;
        for (;;) {
          const cr = buffer.indexOf("\r", pos);
          const lf = buffer.indexOf("\n", pos);
          if (cr === -1 && lf === -1) break;
          let end;
          let next;
          if (cr !== -1 && (lf === -1 || cr < lf)) {
            if (cr + 1 === buffer.length) break; // maybe CRLF split across chunks: wait for more
            end = cr;
            next = buffer[cr + 1] === "\n" ? cr + 2 : cr + 1;
          } else {
            end = lf;
            next = lf + 1;
          }
          line(buffer.slice(pos, end));
          pos = next;
        }
        buffer = buffer.slice(pos);
        if (buffer.length > MAX_LINE_BUFFER) throw new Error("an event stream line is too long");
        onChunk();
      }
    } finally {
      reader.cancel().catch(() => {});
    }
  }

  // --- A request as the page knows it ----------------------------------------------------------------------

  class Req {
    constructor(id, summary, prefix = "q") {
      this.id = id;
      this.prefix = prefix;
      this.session = session;
      this.question = (summary && summary.question) || "";
      this.startedAt = (summary && summary.started_at) || null;
      this.status = (summary && summary.status) || "running";
      this.phase = "";
      this.rounds = 0;
      this.calls = new Map(); // call_id -> {call_id, tool, round, summary, ok, code, duration_ms, rejected, running}
      this.ops = new Map(); // operation_id -> operation (see mergeOperation)
      this.finalText = null;
      this.stopReason = null;
      this.outcome = null;
      this.usage = null; // the model's token totals (RequestUsage), from a view or the final event
      this.error = null;
      this.done = this.status !== "running";
      this.lastEventId = null;
      this.live = "";
      // The model's text as it is written (model_text events): the turn, its newest attempt's text, a restart.
      this.writing = { turn: 0, text: "", note: "" };
      this.abort = null;
      this.pollTimer = null;
      this.queued = false;
      this.el = buildRequestCard(this);
    }
  }

  function mergeOperation(req, data) {
    const id = data.operation_id;
    let op = req.ops.get(id);
    if (!op) {
      op = { operation_id: id, tool: "", state: "", payload: null, fetching: false, deciding: false, error: "" };
      req.ops.set(id, op);
    }
    const keys = ["tool", "state", "target", "digest", "arguments", "approval_expires_at", "approval", "note", "policy", "decided_by"];
    for (const key of keys) {
      if (data[key] !== undefined) op[key] = data[key];
    }
    if (op.state !== "awaiting_approval") {
      op.payload = null;
      op.error = "";
    }
    return op;
  }

  function applyView(req, view) {
    req.status = view.status;
    req.phase = view.phase;
    req.rounds = view.rounds;
    for (const call of view.calls || []) {
      const known = req.calls.get(call.call_id) || {};
      req.calls.set(call.call_id, { ...known, ...call, running: false });
    }
    for (const op of view.operations || []) mergeOperation(req, op);
    req.finalText = view.final_text;
    req.stopReason = view.stop_reason;
    req.error = view.error;
    req.outcome = view.outcome || null;
    if (view.usage) req.usage = view.usage;
    if (view.status !== "running") req.done = true;
    // The view counts the events it already reflects: a stream continues right after them.
    else if (view.events) req.lastEventId = String(Math.max(Number(req.lastEventId) || 0, view.events));
  }

  function applyEvent(req, event) {
    let parsed;
    try {
      parsed = JSON.parse(event.data);
    } catch {
      return;
    }
    if (event.type === "model_text") {
      applyText(req, parsed);
      return;
    }
    const kind = parsed.kind || event.type;
    const data = parsed.data || {};
    if (event.id) req.lastEventId = event.id;
    if (kind === "phase") {
      req.phase = data.phase;
    } else if (kind === "tool_started") {
      const known = req.calls.get(data.call_id);
      if (!known) req.calls.set(data.call_id, { ...data, running: true });
      else known.summary = data.summary;
    } else if (kind === "tool_finished") {
      const known = req.calls.get(data.call_id) || {};
      req.calls.set(data.call_id, { ...known, ...data, running: false });
    } else if (kind === "operation") {
      mergeOperation(req, data);
    } else if (kind === "approval_needed") {
      mergeOperation(req, { ...data, state: "awaiting_approval", approval_expires_at: data.expires_at });
      announce(`Approval needed: ${data.tool} in request ${req.id}`);
    } else if (kind === "final") {
      req.status = data.status || "completed";
      req.stopReason = data.stop_reason || null;
      req.finalText = data.final_text === undefined ? req.finalText : data.final_text;
      req.error = data.error || null;
      req.outcome = data.outcome || null;
      if (data.usage) req.usage = data.usage;
      req.done = true;
    }
  }

  // The newest attempt of each turn only: a restarted turn's earlier text is dropped, never merged.
  function applyText(req, data) {
    const writing = req.writing;
    if (data.kind === "restarted") {
      req.writing = { turn: data.turn, text: "", note: `The model's turn ${data.turn} restarted; what it wrote before is void.` };
    } else if (data.kind === "text" && typeof data.text === "string") {
      if (writing.turn !== data.turn) req.writing = { turn: data.turn, text: "", note: "" };
      req.writing.text += data.text;
    }
  }

  // --- Words for outcomes ----------------------------------------------------------------------------------

  // [data-outcome, words, explanation] of one operation.
  function operationOutcome(state, finished, yours = true) {
    switch (state) {
      case "verified":
        return ["verified", "verified", "done and verified by read-back"];
      case "denied":
        return ["not-done", "not done", "rejected: nothing was sent"];
      case "expired":
        return ["not-done", "not done", "no decision in time: nothing was sent"];
      case "failed":
        return ["not-done", "not done", "the service refused it"];
      case "unknown":
        return finished
          ? ["unknown", "UNKNOWN", "it could not be established whether it happened"]
          : ["unknown", "UNKNOWN", "asking the service whether it happened"];
      case "completed":
        return finished
          ? ["not-verified", "not verified", "done, but the read-back did not confirm it"]
          : ["pending", "checking", "done; reading it back"];
      case "awaiting_approval":
        return yours ? ["pending", "waiting for your decision", ""] : ["pending", "waiting for a decision", ""];
      default:
        return ["pending", "in progress", ""];
    }
  }

  // [data-outcome, words] of a whole request, from the report's outcome (the rule of the CLI's exit code and
  // the UI's list: unsettled side effects outrank everything else); a run ended by Temporal has none.
  function requestOutcome(req) {
    if (!req.done) return ["running", "running"];
    const states = Array.from(req.ops.values(), (op) => op.state);
    switch (req.outcome) {
      case "unknown":
        return states.includes("unknown")
          ? ["unsettled", "UNKNOWN: a side effect's outcome could not be established"]
          : ["unsettled", "not verified: a side effect was done but not verified"];
      case "failed": {
        // A run Temporal ended without a report (terminated, timed out) has no error of its own: say how it ended.
        const how = req.error || (req.status && req.status !== "failed" ? `ended: ${req.status}` : "");
        return ["failed", `failed${how ? `: ${how}` : ""}`];
      }
      case "stopped":
        return ["stopped", `stopped: ${req.stopReason || "a limit"}`];
      case "not_done":
        return ["not-done", "answered, but not all it asked for was done"];
      case "answered":
        return states.length ? ["verified", "answered; every side effect done and verified"] : ["answered", "answered"];
      default:
        return ["failed", `ended: ${req.status}`];
    }
  }

  // The model's token totals in words, as the CLI prints them; "" when no turn reported usage.
  function usageWords(usage) {
    if (!usage || !usage.turns) return "";
    const n = (value) => Number(value || 0).toLocaleString("en-US");
    let words = `${n(usage.input_tokens)} in (${n(usage.cached_input_tokens)} cached), ${n(usage.output_tokens)} out, ${n(usage.total_tokens)} total`;
    if (usage.cost !== null && usage.cost !== undefined) {
      words += `; cost ${Number(usage.cost).toLocaleString("en-US", { maximumFractionDigits: 6 })}`;
    }
    return words;
  }

  // --- Approval policies in words ---------------------------------------------------------------------------

  // Whether the signed-in caller may decide this waiting operation (an ApprovalRequest) now: the same rule as
  // the API's ApprovalRequest.may_decide, so the page offers buttons only where a decision can be recorded
  // (the API and the workflow check it again).
  function mayDecide(approval) {
    if (!me || !approval) return false;
    const requester = approval.actor && approval.actor.user_id ? approval.actor.user_id : me.user_id;
    const policy = approval.policy;
    if (!policy || !policy.deciders) return me.user_id === requester;
    const approved = policy.approved_by || [];
    if (approved.includes(me.user_id)) return false;
    if (me.user_id === requester && approved.length) return false; // the requester counts only as the first
    const deciders = policy.deciders;
    return (Boolean(deciders.requester) && me.user_id === requester) || (deciders.roles || []).some((r) => me.roles.includes(r));
  }

  // Who may decide, as the API's Deciders.describe says it.
  function deciderWords(deciders) {
    if (!deciders) return "the requester";
    const who = (deciders.requester ? ["the requester"] : []).concat((deciders.roles || []).map((role) => `a ${role}`));
    const text = who.join(" or ") || "nobody";
    return deciders.approvals === 2 ? `two people (${text}; the requester never second)` : text;
  }

  function ruleWords(rules) {
    const list = rules || [];
    if (!list.length) return "no rule";
    return `${list.length === 1 ? "rule" : "rules"} ${list.join(", ")}`;
  }

  // A policy version ("sha256:<64 hex>") short enough to read; the whole one is the element's title.
  function shortVersion(version) {
    if (!version) return "";
    return version.length > 19 ? `${version.slice(0, 18)}…` : version;
  }

  function approvedSoFar(policy) {
    const people = (policy && policy.approved_by) || [];
    return people.length ? people.join(" and ") : "nobody yet";
  }

  // Which rule or which people decided a write (or, while it waits, whom it waits for), from the operation's
  // policy and approval records (or an `operation` event's decided_by); "" when nothing is known yet.
  function decidedWords(op) {
    const policy = op.policy || null;
    const by = op.approval ? op.approval.by : op.decided_by || "";
    const rejected = op.approval ? op.approval.decision === "rejected" : op.state === "denied";
    if (policy && policy.verdict === "deny") {
      const rules = (policy.rules || []).length ? `'s ${ruleWords(policy.rules)}` : "";
      return `Denied by the policy${rules}${policy.reason ? ` (${policy.reason})` : ""}`;
    }
    if (policy && policy.verdict === "allow") return `Approved by the policy's ${ruleWords(policy.rules)}, no person asked`;
    const asked = policy ? `${ruleWords(policy.rules)} asked ${deciderWords(policy.deciders)}` : "";
    if (op.state === "awaiting_approval") {
      // A first approval of four eyes is recorded while the operation still waits for the second.
      if (!asked) return "";
      const twoPeople = policy.deciders && policy.deciders.approvals === 2;
      return `Waiting: the policy's ${asked}${twoPeople ? `; approved so far by ${approvedSoFar(policy)}` : ""}`;
    }
    if (by) {
      const who = `${rejected ? "Rejected" : "Approved"} by ${by}`;
      return asked ? `${who} (${asked})` : who;
    }
    if (!asked) return "";
    if (op.state === "expired") return `The policy's ${asked}; nobody decided in time`;
    return `The policy's ${asked}`;
  }

  // --- Rendering -------------------------------------------------------------------------------------------

  function buildRequestCard(req) {
    const titleId = `${req.prefix}-${req.id}`;
    const card = el(
      "li",
      { className: "request", "data-request-id": req.id, "data-status": req.status },
      el(
        "article",
        { "aria-labelledby": titleId },
        el(
          "header",
          { className: "request-head" },
          el("h3", { id: titleId, className: "question", "data-field": "question" }),
          el("span", { className: "badge", "data-field": "status" }),
        ),
        el(
          "p",
          { className: "meta" },
          "Request ",
          el("code", { "data-field": "id", text: req.id }),
          el("span", { "data-field": "started" }),
          " ",
          el("span", { className: "live", "data-field": "live" }),
          el("button", { type: "button", className: "link", "data-action": "reconnect", hidden: true, text: "Reconnect" }),
        ),
        el("p", { className: "phase" }, el("span", { className: "label", text: "Phase: " }), el("span", { "data-field": "phase" })),
        el(
          "p",
          { className: "usage", "data-field": "usage-line", hidden: true },
          el("span", { className: "label", text: "Tokens: " }),
          el("span", { "data-field": "usage" }),
        ),
        el(
          "section",
          { className: "operations", "data-field": "operations-section", hidden: true },
          el("h4", { text: "Side effects" }),
          el("ul", { className: "ops", "data-field": "operations" }),
        ),
        el(
          "table",
          { className: "calls", "data-field": "calls-table", hidden: true },
          el("caption", { text: "Tool calls" }),
          el(
            "thead",
            {},
            el(
              "tr",
              {},
              el("th", { scope: "col", text: "Round" }),
              el("th", { scope: "col", text: "Call" }),
              el("th", { scope: "col", text: "Result" }),
              el("th", { scope: "col", text: "Duration" }),
            ),
          ),
          el("tbody", { "data-field": "calls" }),
        ),
        el(
          "section",
          { className: "writing", "data-field": "writing", hidden: true, "aria-live": "off" },
          el("h4", { text: "The model is writing" }),
          el("p", { className: "writing-note", "data-field": "writing-note" }),
          el("p", { className: "writing-text", "data-field": "writing-text" }),
        ),
        el(
          "section",
          { className: "answer", "data-field": "answer", hidden: true },
          el("h4", { text: "Answer" }),
          el("p", { className: "final-text", "data-field": "final-text" }),
        ),
        el("p", { className: "outcome", "data-field": "request-outcome" }),
      ),
    );
    card.querySelector('[data-action="reconnect"]').addEventListener("click", () => {
      if (!req.done) wantStream(req, true);
    });
    return card;
  }

  function render(req) {
    if (req.session !== session) return;
    const card = req.el;
    const [outcome, outcomeWords] = requestOutcome(req);
    card.dataset.status = req.status;
    card.dataset.outcome = outcome;
    setText(field(card, "question"), req.question || "(question not shown)");
    setText(field(card, "status"), req.status);
    setText(field(card, "started"), req.startedAt ? `, started ${formatTime(req.startedAt)}` : "");
    setText(field(card, "phase"), req.phase || (req.done ? "finished" : "starting"));
    const usage = usageWords(req.usage);
    setText(field(card, "usage"), usage);
    field(card, "usage-line").hidden = !usage;
    const live = field(card, "live");
    const liveWords = { live: "live", reconnecting: "reconnecting…", lost: "live updates stopped", polling: "updating every few seconds" };
    setText(live, req.done ? "" : liveWords[req.live] || "");
    live.dataset.live = req.done ? "done" : req.live;
    card.querySelector('[data-action="reconnect"]').hidden = req.done || req.live !== "lost";

    renderCalls(req, card);
    renderOperations(req, card);

    // The text as it is written, until the answer is final (then the answer, once).
    field(card, "writing").hidden = req.done || !(req.writing.text || req.writing.note);
    setText(field(card, "writing-note"), req.done ? "" : req.writing.note);
    setText(field(card, "writing-text"), req.done ? "" : req.writing.text);
    const answer = field(card, "answer");
    answer.hidden = !req.done;
    const finalText = field(card, "final-text");
    setText(finalText, req.finalText || (req.done ? "(no answer)" : ""));
    finalText.classList.toggle("empty", !req.finalText);
    const outcomeNode = field(card, "request-outcome");
    setText(outcomeNode, req.done ? `Outcome: ${outcomeWords}` : "");
    outcomeNode.dataset.outcome = outcome;
  }

  function renderCalls(req, card) {
    const table = field(card, "calls-table");
    const body = field(card, "calls");
    table.hidden = req.calls.size === 0;
    const rows = [];
    for (const call of req.calls.values()) {
      let result;
      if (call.running) result = "running…";
      else if (call.ok) result = "ok";
      else result = call.code || "failed";
      if (call.rejected) result += " (rejected, not run)";
      const outcome = call.running ? "running" : call.ok ? "ok" : "error";
      rows.push(
        el(
          "tr",
          { "data-call-id": call.call_id, "data-code": call.running ? null : call.ok ? "ok" : call.code || "failed" },
          el("td", { text: call.round === undefined ? "" : call.round }),
          el(
            "td",
            {},
            el("span", { className: "tool", text: call.tool || "" }),
            el("span", { className: "summary", text: summaryRest(call) }),
            " ",
            el("code", { className: "call-id", text: call.call_id }),
          ),
          el("td", { className: `result ${outcome}`, "data-field": "result", text: result }),
          el("td", { text: call.running || call.duration_ms === undefined ? "" : `${call.duration_ms} ms` }),
        ),
      );
    }
    body.replaceChildren(...rows);
  }

  // What a call's summary ("refund_order A100 500") says besides the tool's name.
  function summaryRest(call) {
    const summary = call.summary || "";
    const rest = call.tool && summary.startsWith(call.tool) ? summary.slice(call.tool.length) : summary ? ` ${summary}` : "";
    return rest.trim() ? ` ${rest.trim()}` : "";
  }

  function renderOperations(req, card) {
    const list = field(card, "operations");
    field(card, "operations-section").hidden = req.ops.size === 0;
    for (const op of req.ops.values()) {
      let item = list.querySelector(`[data-operation-id="${CSS.escape(op.operation_id)}"]`);
      if (!item) {
        item = el(
          "li",
          { className: "operation", "data-operation-id": op.operation_id },
          el("span", { className: "tool", "data-field": "tool" }),
          " ",
          el("code", { className: "op-id", "data-field": "operation-id", title: op.operation_id, text: shortId(op.operation_id) }),
          " ",
          el("span", { className: "state", "data-field": "state" }),
          " ",
          el("strong", { className: "op-outcome", "data-field": "outcome", tabindex: "-1" }),
          " ",
          el("span", { className: "why", "data-field": "why" }),
          el("p", { className: "note", "data-field": "note", hidden: true }),
          el(
            "p",
            { className: "decided", "data-field": "decided-line", hidden: true },
            el("span", { "data-field": "decided" }),
            " ",
            el("code", { className: "policy-version", "data-field": "policy-version" }),
          ),
        );
        list.append(item);
      }
      const yours = !(op.state === "awaiting_approval" && op.payload && !mayDecide(op.payload));
      const [outcome, words, why] = operationOutcome(op.state, req.done, yours);
      item.dataset.state = op.state;
      item.dataset.outcome = outcome;
      setText(field(item, "tool"), op.tool);
      setText(field(item, "state"), `state: ${op.state}`);
      setText(field(item, "outcome"), words);
      setText(field(item, "why"), why ? `(${why})` : "");
      const note = field(item, "note");
      setText(note, op.note || "");
      note.hidden = !op.note;
      const decided = decidedWords(op);
      const version = op.policy && op.policy.version ? op.policy.version : "";
      setText(field(item, "decided"), decided);
      const versionNode = field(item, "policy-version");
      setText(versionNode, version ? `policy ${shortVersion(version)}` : "");
      if (version) versionNode.title = `policy version ${version}`;
      else versionNode.removeAttribute("title");
      field(item, "decided-line").hidden = !decided && !version;
      renderApproval(req, op, item);
    }
  }

  function shortId(id) {
    return id.length > 15 ? `${id.slice(0, 14)}…` : id;
  }

  // --- Approvals -------------------------------------------------------------------------------------------

  function renderApproval(req, op, item) {
    let card = item.querySelector(".approval");
    const pending = op.state === "awaiting_approval" && !req.done;
    if (!pending) {
      if (card) card.remove();
      return;
    }
    if (!op.payload) {
      if (!op.fetching && Date.now() >= (op.retryAt || 0)) fetchPayload(req, op);
      if (!card) {
        card = el("section", { className: "approval loading", "data-operation-id": op.operation_id, "data-ready": "false" });
        card.append(el("p", { "data-field": "approval-loading", text: "Loading the operation's whole payload…" }));
        card.append(el("p", { className: "error", role: "alert", "data-field": "approval-error", hidden: true }));
        item.append(card);
      }
      showError(field(card, "approval-error"), op.error);
      return;
    }
    if (card && card.dataset.ready === "true" && card.dataset.shape === approvalShape(op.payload)) {
      showError(field(card, "approval-error"), op.error);
      for (const button of card.querySelectorAll("button[data-action]")) {
        button.disabled = op.deciding || (button.dataset.action === "approve" && op.check === "mismatch");
      }
      return;
    }
    const fresh = buildApprovalCard(req, op);
    if (card) card.replaceWith(fresh);
    else item.append(fresh);
  }

  // What a built card depends on besides its operation's state: the payload's digest, whether it is the
  // caller's to decide, and who has approved so far (four eyes).
  function approvalShape(payload) {
    const approved = (payload.policy && payload.policy.approved_by) || [];
    return JSON.stringify([payload.digest, mayDecide(payload), approved]);
  }

  async function fetchPayload(req, op) {
    op.fetching = true;
    op.error = "";
    const mine = session;
    try {
      const payload = await api(`${requestPath(req.id)}/operations/${encodeURIComponent(op.operation_id)}`, {
        exactArguments: true,
      });
      if (mine !== session) return;
      const check = await digestCheck(payload);
      if (payload.state !== "awaiting_approval") {
        // Decided or expired meanwhile: the server's word is newer than the events seen so far.
        op.state = payload.state;
        op.payload = null;
      } else {
        op.payload = payload;
        op.check = check;
        if (payload.policy !== undefined) op.policy = payload.policy;
      }
    } catch (error) {
      op.error = `Could not load the operation: ${describe(error)}`;
      // Try again after a pause, so a hiccup does not leave the card empty (and no render fetches sooner).
      op.retryAt = Date.now() + POLL_MS;
      setTimeout(() => {
        if (mine === session && op.state === "awaiting_approval" && !op.payload) render(req);
      }, POLL_MS);
    } finally {
      op.fetching = false;
    }
    render(req);
  }

  // A value as its JSON text (compact: all whitespace shown is part of a string), so "500" and 500 differ.
  function valueText(value) {
    const text = canonicalJson(value);
    return escapeHidden(text === undefined ? String(value) : text);
  }

  function checkWords(check) {
    return {
      ok: "matches the arguments shown (recomputed in this page)",
      mismatch: "DOES NOT MATCH the arguments shown: do not approve",
      unavailable:
        "not recomputed in this browser (it needs a secure context, and numbers' source text); the API checks it before signing",
    }[check];
  }

  // "ok", "mismatch" or "unavailable": the payload's digest recomputed here from what is shown.
  async function digestCheck(payload) {
    if (!(window.crypto && crypto.subtle)) return "unavailable";
    if (hasPlainNumber(payload.arguments)) return "unavailable"; // no source text: Python's cannot be rebuilt
    try {
      const digest = await payloadDigest(payload.target || payload.tool, payload.arguments);
      return digest === payload.digest ? "ok" : "mismatch";
    } catch {
      return "unavailable";
    }
  }

  // Every argument, each value as its exact JSON text; a warning when any holds hidden characters; and the
  // exact text the digest covers.
  function payloadParts(payload) {
    const args = payload.arguments || {};
    const target = payload.target || payload.tool;
    const rows = Object.keys(args).map((name) =>
      el(
        "tr",
        { "data-arg": name },
        el("th", { scope: "row" }, el("code", { text: escapeHidden(name) })),
        el("td", {}, el("code", { className: "value", "data-field": "arg-value", text: valueText(args[name]) })),
      ),
    );
    return [
      el(
        "table",
        { className: "arguments", "data-field": "approval-arguments" },
        el("caption", { text: `Arguments: all ${rows.length}, exactly as they will be sent` }),
        el("thead", {}, el("tr", {}, el("th", { scope: "col", text: "Name" }), el("th", { scope: "col", text: "Value (JSON)" }))),
        el("tbody", {}, ...rows),
      ),
      hasHidden(canonicalJson(args))
        ? el("p", {
            className: "warning",
            "data-field": "hidden-characters",
            text: "The arguments contain invisible or unusual characters; they are shown as \\u escapes.",
          })
        : null,
      el(
        "details",
        {},
        el("summary", { text: "The exact text the digest covers" }),
        el("pre", {
          className: "canonical",
          "data-field": "approval-canonical",
          text: escapeHidden(canonicalJson({ tool: target, arguments: args })),
        }),
      ),
    ];
  }

  // What is signed and until when, as every approval card shows it: the digest, the page's own check of it, and
  // the end of the approval window.
  function digestFacts(payload, check) {
    return [
      el("dt", { text: "Digest" }),
      el("dd", {}, el("code", { className: "digest", "data-field": "approval-digest", text: payload.digest })),
      el("dt", { text: "Digest check" }),
      el("dd", { "data-field": "digest-check", "data-check": check, className: `check ${check}`, text: checkWords(check) }),
      el("dt", { text: "Approval expires" }),
      el("dd", {
        "data-field": "approval-expires",
        "data-expires-at": payload.approval_expires_at || null,
        text: payload.approval_expires_at ? formatTime(payload.approval_expires_at) : "no expiry given",
      }),
    ];
  }

  // What the approval policy asked for (dt/dd pairs): the rules, who decides, for four eyes who has approved
  // so far, and the policy's version. None without a policy (the requester decides).
  function policyFacts(policy) {
    if (!policy) return [];
    const facts = [
      el("dt", { text: "Asked by" }),
      el("dd", { "data-field": "approval-rules", text: `the policy's ${ruleWords(policy.rules)}` }),
      el("dt", { text: "Who decides" }),
      el("dd", { "data-field": "approval-deciders", text: deciderWords(policy.deciders) }),
    ];
    if (policy.deciders && policy.deciders.approvals === 2) {
      facts.push(
        el("dt", { text: "Approved so far" }),
        el("dd", { "data-field": "approval-approved-so-far", text: approvedSoFar(policy) }),
      );
    }
    if (policy.version) {
      facts.push(
        el("dt", { text: "Policy version" }),
        el("dd", {}, el("code", { "data-field": "approval-policy-version", title: policy.version, text: shortVersion(policy.version) })),
      );
    }
    return facts;
  }

  function decisionButtons(describedBy, disabled, onDecide) {
    const approve = el("button", {
      type: "button",
      className: "approve",
      "data-action": "approve",
      "aria-describedby": describedBy,
      text: "Approve",
    });
    const reject = el("button", {
      type: "button",
      className: "reject",
      "data-action": "reject",
      "aria-describedby": describedBy,
      text: "Reject",
    });
    approve.disabled = disabled.approve;
    reject.disabled = disabled.reject;
    approve.addEventListener("click", () => onDecide("approve"));
    reject.addEventListener("click", () => onDecide("reject"));
    return el("div", { className: "actions" }, approve, reject);
  }

  function buildApprovalCard(req, op) {
    const payload = op.payload;
    const titleId = `approval-${op.operation_id}`;
    const target = payload.target || payload.tool;
    const yours = mayDecide(payload);
    const actions = yours
      ? decisionButtons(titleId, { approve: op.check === "mismatch" || op.deciding, reject: op.deciding }, (decision) =>
          decide(req, op, decision),
        )
      : el("p", {
          className: "not-yours",
          "data-field": "approval-not-yours",
          text:
            `Not yours to decide: the approval policy leaves it to ${deciderWords(payload.policy && payload.policy.deciders)}` +
            (payload.policy && (payload.policy.approved_by || []).length ? ` (approved so far by ${approvedSoFar(payload.policy)})` : "") +
            ". This card shows the decision once it is made.",
        });

    const card = el(
      "section",
      {
        className: "approval",
        "data-operation-id": op.operation_id,
        "data-ready": "true",
        "data-digest": payload.digest,
        "data-shape": approvalShape(payload),
        "data-check": op.check,
        "data-yours": yours ? "true" : "false",
        "aria-labelledby": titleId,
        role: "group",
      },
      el("h5", { id: titleId, text: `${yours ? "Approval needed" : "Waiting for approval"}: ${payload.tool} (${target})` }),
      el(
        "dl",
        {},
        el("dt", { text: "Tool" }),
        el("dd", {}, el("code", { "data-field": "approval-tool", text: payload.tool })),
        el("dt", { text: "Request" }),
        el("dd", {}, el("code", { "data-field": "approval-target", text: target })),
        el("dt", { text: "Operation" }),
        el("dd", {}, el("code", { "data-field": "approval-operation", text: payload.operation_id })),
        ...digestFacts(payload, op.check),
        el("dt", { text: "Request deadline" }),
        el("dd", { "data-field": "approval-deadline", text: payload.deadline ? formatTime(payload.deadline) : "none" }),
        ...policyFacts(payload.policy),
        yours ? el("dt", { text: "You decide as" }) : null,
        yours ? el("dd", { "data-field": "approval-decider", text: $("who").dataset.actor || "" }) : null,
      ),
      ...payloadParts(payload),
      actions,
      el("p", { className: "error", role: "alert", "data-field": "approval-error", hidden: !op.error, text: op.error }),
    );
    updateExpiry(card);
    return card;
  }

  async function decide(req, op, decision) {
    if (op.deciding || !op.payload) return;
    if (decision === "approve" && op.check === "mismatch") return;
    op.deciding = true;
    op.error = "";
    render(req);
    const mine = session;
    try {
      const record = await api(`${requestPath(req.id)}/operations/${encodeURIComponent(op.operation_id)}/decision`, {
        method: "POST",
        body: { decision, digest: op.payload.digest },
      });
      if (mine !== session) return;
      mergeOperation(req, record);
      // Still waiting (four eyes: the first of two approvals): read it again, with who has approved so far.
      if (record.state === "awaiting_approval") op.payload = null;
      announce(`${decision === "approve" ? "Approved" : "Rejected"}: ${record.tool}`);
    } catch (error) {
      if (mine !== session) return;
      op.error = decisionFailure(error);
      if (!refused(error) || error.code === "NOT_PENDING" || error.code === "DIGEST_MISMATCH") {
        op.payload = null; // fetch it again: what is pending now is what may be decided
      }
    } finally {
      op.deciding = false;
    }
    render(req);
    const item = req.el.querySelector(`[data-operation-id="${CSS.escape(op.operation_id)}"]`);
    if (item && op.state !== "awaiting_approval") field(item, "outcome").focus();
  }

  function updateExpiry(root) {
    for (const node of root.querySelectorAll("[data-expires-at]")) {
      const iso = node.dataset.expiresAt;
      const left = new Date(iso).getTime() - Date.now();
      setText(node, `${formatTime(iso)}, ${left > 0 ? relative(iso) : "expired"}`);
      node.classList.toggle("expired", left <= 0);
    }
  }

  // --- Following a request ---------------------------------------------------------------------------------

  async function refreshView(req) {
    const view = await api(requestPath(req.id));
    if (req.session !== session) return view;
    applyView(req, view);
    render(req);
    return view;
  }

  // After `final`, the workflow returns a moment later: read the finished view (the authoritative report).
  async function settle(req) {
    for (let i = 0; i < 20; i += 1) {
      try {
        const view = await api(requestPath(req.id));
        if (req.session !== session) return;
        if (view.status !== "running") {
          applyView(req, view);
          break;
        }
      } catch (error) {
        if (error instanceof ApiError && (error.status === 401 || error.status === 404)) break;
      }
      await sleep(250 * Math.min(i + 1, 4));
    }
    render(req);
    announce(`Request finished: ${requestOutcome(req)[1]}`);
  }

  function wantStream(req, front = false) {
    if (req.done || req.session !== session || req.abort || req.queued) return;
    if (streamsInUse < MAX_STREAMS) {
      follow(req);
      return;
    }
    req.queued = true;
    if (front) streamQueue.unshift(req);
    else streamQueue.push(req);
    req.live = "polling";
    render(req);
    schedulePoll(req);
  }

  function schedulePoll(req) {
    clearTimeout(req.pollTimer);
    req.pollTimer = setTimeout(async () => {
      if (!req.queued || req.done || req.session !== session) return;
      try {
        await refreshView(req);
      } catch {
        // the next poll tries again
      }
      if (req.done) {
        dequeue(req);
        settle(req);
      } else schedulePoll(req);
    }, POLL_MS);
  }

  function dequeue(req) {
    const at = streamQueue.indexOf(req);
    if (at !== -1) streamQueue.splice(at, 1);
    req.queued = false;
    clearTimeout(req.pollTimer);
  }

  function releaseSlot() {
    streamsInUse -= 1;
    while (streamQueue.length && streamsInUse < MAX_STREAMS) {
      const next = streamQueue.shift();
      next.queued = false;
      clearTimeout(next.pollTimer);
      if (!next.done && next.session === session) follow(next);
    }
  }

  async function follow(req) {
    streamsInUse += 1;
    const controller = new AbortController();
    req.abort = controller;
    let failures = 0;
    try {
      while (!req.done && req.session === session && !controller.signal.aborted) {
        let received = 0;
        let problem = null;
        try {
          const response = await fetchEvents(`${requestPath(req.id)}/events`, req.lastEventId, controller.signal);
          if (response.status === 401) {
            signedOut("Your token is no longer accepted: log in again.");
            return;
          }
          if (response.status === 404) {
            req.live = "lost";
            req.phase = "this request is not found any more";
            render(req);
            return;
          }
          if (!response.ok || !response.body) throw new Error(`HTTP ${response.status}`);
          req.live = "live";
          // A (re)opened stream sends the run's text again from its start.
          req.writing = { turn: 0, text: "", note: "" };
          render(req);
          await readEventStream(
            response.body,
            (event) => {
              received += 1;
              applyEvent(req, event);
            },
            () => render(req),
          );
        } catch (error) {
          if (controller.signal.aborted) return;
          problem = error;
        }
        if (req.done) break;
        if (received) failures = 0;
        // The stream ended without `final` (dropped, or the server's own time bound): is it still running?
        if (!problem) {
          try {
            await refreshView(req);
          } catch {
            // counted below
          }
          if (req.done) break;
        }
        failures += 1;
        if (failures > MAX_RETRIES) {
          req.live = "lost";
          render(req);
          return;
        }
        req.live = "reconnecting";
        render(req);
        await sleep(Math.min(500 * 2 ** (failures - 1), 8000) * (0.75 + Math.random() / 2));
      }
    } finally {
      if (req.abort === controller) req.abort = null;
      releaseSlot();
    }
    if (req.done && req.session === session) await settle(req);
  }

  // --- The list --------------------------------------------------------------------------------------------

  function track(summary) {
    let req = requests.get(summary.id);
    if (!req) {
      req = new Req(summary.id, summary);
      requests.set(req.id, req);
      render(req);
      load(req);
    } else if (summary.started_at && !req.startedAt) {
      req.startedAt = summary.started_at;
    }
    return req;
  }

  async function load(req, front = false) {
    try {
      await refreshView(req);
    } catch (error) {
      if (req.session !== session) return;
      req.phase = `could not load: ${describe(error)}`;
      render(req);
    }
    if (!req.done) wantStream(req, front);
  }

  async function loadList(more = false) {
    const mine = session;
    const errorNode = $("list-error");
    showError(errorNode, "");
    const params = new URLSearchParams({ page_size: String(PAGE_SIZE) });
    if (more && nextPageToken) params.set("page_token", nextPageToken);
    let page;
    try {
      page = await api(`/v1/requests?${params}`);
    } catch (error) {
      if (mine === session) showError(errorNode, `Could not list your requests: ${describe(error)}`);
      return;
    }
    if (mine !== session) return;
    nextPageToken = page.next_page_token || null;
    $("more").hidden = !nextPageToken;
    const list = $("requests");
    const listed = page.requests.map(track);
    if (!more) {
      // Requests started here that the list does not show yet (it is eventually consistent) stay on top.
      const listedIds = new Set(listed.map((r) => r.id));
      const unlisted = Array.from(list.children).filter((node) => !listedIds.has(node.dataset.requestId));
      list.replaceChildren(...unlisted, ...listed.map((r) => r.el));
    } else {
      for (const req of listed) if (!req.el.isConnected) list.append(req.el);
    }
    $("list-empty").hidden = list.children.length > 0;
  }

  // --- Asking ----------------------------------------------------------------------------------------------

  let pendingKey = null; // reused when the same question is sent again after a failure: one request, not two
  let pendingQuestion = null;

  function newKey() {
    const bytes = new Uint8Array(8);
    crypto.getRandomValues(bytes);
    return "web-" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  }

  async function ask(event) {
    event.preventDefault();
    const input = $("question");
    const errorNode = $("ask-error");
    const question = input.value.trim();
    if (!question) {
      showError(errorNode, "Type a question first.");
      input.focus();
      return;
    }
    if (question !== pendingQuestion) {
      pendingQuestion = question;
      pendingKey = newKey();
    }
    const button = $("ask-submit");
    button.disabled = true;
    showError(errorNode, "");
    const mine = session;
    try {
      const summary = await api("/v1/requests", {
        method: "POST",
        body: { question },
        headers: { "Idempotency-Key": pendingKey },
      });
      if (mine !== session) return;
      pendingKey = null;
      pendingQuestion = null;
      input.value = "";
      const req = requests.get(summary.id) || new Req(summary.id, { ...summary, question });
      requests.set(req.id, req);
      $("requests").prepend(req.el);
      $("list-empty").hidden = true;
      render(req);
      announce("Request started");
      load(req, true);
    } catch (error) {
      if (mine === session) showError(errorNode, `The request was not started: ${describe(error)}`);
    } finally {
      button.disabled = false;
    }
  }

  // --- A conversation (a thread) ----------------------------------------------------------------------------

  // One thread at a time: its messages are Req cards (the same rendering and approvals as the list's), kept
  // up to date by the thread's one event stream (accepted, started, the request's own events, finished).
  const THREAD_ID = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;
  let thread = null; // {id, session, reqs: Map(request id -> Req), lastEventId, abort, following}
  const threadPath = (id) => `/v1/threads/${encodeURIComponent(id)}`;

  function messageCard(t, data) {
    let req = t.reqs.get(data.request_id);
    if (!req) {
      req = new Req(data.request_id, { question: data.question || "", status: "running" }, "m");
      req.number = data.number;
      req.el.dataset.number = String(data.number);
      t.reqs.set(req.id, req);
      const list = $("thread-messages");
      const after = Array.from(list.children).find((node) => Number(node.dataset.number) > data.number);
      list.insertBefore(req.el, after || null);
      $("thread-empty").hidden = true;
    }
    if (data.question && !req.question) req.question = data.question;
    return req;
  }

  function markQueued(req, ahead) {
    req.status = "queued";
    req.done = false;
    req.phase = `queued: waiting for ${ahead || "the"} message${ahead === 1 ? "" : "s"} before it`;
    req.el.dataset.queued = "true";
  }

  function markStarted(req) {
    if (req.status === "queued") {
      req.status = "running";
      req.phase = "started";
    }
    delete req.el.dataset.queued;
  }

  function applyThreadEvent(t, event) {
    let data;
    try {
      data = JSON.parse(event.data);
    } catch {
      return;
    }
    if (event.id) t.lastEventId = event.id;
    if (event.type === "error") {
      if (data.code === "THREAD_CLOSED") {
        markThreadClosed(t);
        return;
      }
      showError($("thread-error"), `The conversation's updates stopped: ${data.detail} (${data.code})`);
      return;
    }
    if (!data.request_id) return;
    const req = messageCard(t, data);
    if (event.type === "message_accepted") {
      if (data.state === "queued" && !req.done) markQueued(req, data.ahead);
    } else if (event.type === "message_started") {
      markStarted(req);
    } else if (event.type === "message_finished") {
      markStarted(req);
      req.done = true;
      settle(req);
    } else if (event.type === "message_refused") {
      req.status = "refused";
      req.done = true;
      req.error = data.note || "its request could not start";
      req.phase = `refused: ${req.error}`;
      delete req.el.dataset.queued;
    } else {
      markStarted(req);
      // The request's own event: applied as its own stream's would be (the stream's place is the thread's).
      applyEvent(req, { type: event.type, data: event.data, id: null });
    }
    render(req);
  }

  async function followThread(t) {
    if (t.following) return;
    t.following = true;
    const controller = new AbortController();
    t.abort = controller;
    let failures = 0;
    const live = $("thread-live");
    try {
      while (thread === t && t.session === session && !controller.signal.aborted && !t.ended) {
        let received = 0;
        try {
          const response = await fetchEvents(`${threadPath(t.id)}/events`, t.lastEventId, controller.signal);
          if (response.status === 401) {
            signedOut("Your token is no longer accepted: log in again.");
            return;
          }
          if (!response.ok || !response.body) throw new Error(`HTTP ${response.status}`);
          setText(live, "live");
          live.dataset.live = "live";
          await readEventStream(
            response.body,
            (event) => {
              // An error event is no progress: a stream that keeps ending with one must not reconnect for ever.
              if (event.type !== "error") received += 1;
              if (thread === t) applyThreadEvent(t, event);
            },
            () => {},
          );
        } catch (error) {
          if (controller.signal.aborted) return;
        }
        if (t.ended) return; // closed, and every message it took has run: nothing more will come
        // The stream ended (dropped, or the server's own time bound): continue from the last event seen.
        failures = received ? 1 : failures + 1;
        if (failures > MAX_RETRIES) {
          setText(live, "live updates stopped: open the thread again");
          live.dataset.live = "lost";
          return;
        }
        setText(live, "reconnecting…");
        live.dataset.live = "reconnecting";
        await sleep(Math.min(500 * 2 ** (failures - 1), 8000) * (0.75 + Math.random() / 2));
      }
    } finally {
      t.following = false;
      if (t.abort === controller) t.abort = null;
    }
  }

  function closeThread() {
    if (thread && thread.abort) thread.abort.abort();
    thread = null;
    $("thread-messages").replaceChildren();
    $("thread-view").hidden = true;
  }

  // A closed thread takes no new message; its stream's THREAD_CLOSED says its workflow has ended (its messages
  // have run), and a send refused with THREAD_CLOSED says it was closed.
  function markThreadClosed(t, ended = true) {
    if (thread !== t) return;
    t.closed = true;
    if (ended) {
      t.ended = true;
      const live = $("thread-live");
      setText(live, "closed");
      live.dataset.live = "closed";
    }
    $("thread-closed").hidden = false;
    $("thread-end").disabled = true;
    $("message").disabled = true;
    $("message-submit").disabled = true;
  }

  async function endThread() {
    const t = thread;
    if (!t) return;
    const button = $("thread-end");
    button.disabled = true;
    showError($("thread-error"), "");
    try {
      await api(`${threadPath(t.id)}/close`, { method: "POST" });
      markThreadClosed(t, false);
      announce("Conversation closed");
      loadThreads();
    } catch (error) {
      if (thread !== t) return;
      button.disabled = false;
      showError($("thread-error"), `The conversation was not closed: ${describe(error)}`);
    }
  }

  let pendingMessageKey = null; // reused when the same message is sent again after a failure: one message
  let pendingMessage = null;

  async function openThread(id) {
    const errorNode = $("thread-error");
    showError(errorNode, "");
    // A message's Idempotency-Key belongs to the thread it was typed in: never sent to another one.
    pendingMessage = null;
    pendingMessageKey = null;
    if (!THREAD_ID.test(id)) {
      showError(errorNode, "A thread id is 1-64 of A-Z a-z 0-9 _ . - (first a letter or digit).");
      $("thread-id").focus();
      return;
    }
    closeThread();
    const t = { id, session, reqs: new Map(), lastEventId: null, abort: null, following: false };
    thread = t;
    $("thread-closed").hidden = true;
    $("thread-end").disabled = false;
    $("message").disabled = false;
    $("message-submit").disabled = false;
    $("thread-id").value = id;
    setText($("thread-name"), id);
    setText($("thread-live"), "");
    $("thread-view").hidden = false;
    $("thread-empty").hidden = false;
    let view = null;
    try {
      view = await api(threadPath(id));
    } catch (error) {
      if (thread !== t) return;
      if (!(error instanceof ApiError && error.status === 404)) {
        showError(errorNode, `Could not open the thread: ${describe(error)}`);
        return;
      }
      // No such thread yet: its first message starts it.
    }
    if (thread !== t) return;
    if (view) {
      for (const message of view.messages) {
        const req = messageCard(t, message);
        if (message.state === "queued") {
          markQueued(req, message.ahead);
          render(req);
        } else if (message.state === "refused") {
          applyThreadEvent(t, { type: "message_refused", data: JSON.stringify(message), id: null });
        } else {
          refreshView(req).catch((error) => {
            req.phase = `could not load: ${describe(error)}`;
            render(req);
          });
        }
      }
      // The stream continues from this view: later messages, and the first unfinished one from its start.
      t.lastEventId = view.last_event_id;
      followThread(t);
    }
    $("message").focus();
  }


  async function sendMessage(event) {
    event.preventDefault();
    const t = thread;
    const input = $("message");
    const errorNode = $("message-error");
    const question = input.value.trim();
    if (!t) return;
    if (!question) {
      showError(errorNode, "Type a message first.");
      input.focus();
      return;
    }
    if (question !== pendingMessage) {
      pendingMessage = question;
      pendingMessageKey = newKey();
    }
    const button = $("message-submit");
    button.disabled = true;
    showError(errorNode, "");
    try {
      const answer = await api(`${threadPath(t.id)}/messages`, {
        method: "POST",
        body: { question },
        headers: { "Idempotency-Key": pendingMessageKey },
      });
      if (thread !== t) return;
      pendingMessageKey = null;
      pendingMessage = null;
      input.value = "";
      const req = messageCard(t, { ...answer, question });
      if (answer.queued && !req.done) markQueued(req, answer.ahead);
      render(req);
      announce(answer.queued ? `Message ${answer.number} queued behind ${answer.ahead}` : `Message ${answer.number} sent`);
      followThread(t);
      loadThreads();
    } catch (error) {
      if (thread === t) showError(errorNode, `The message was not sent: ${describe(error)}`);
      if (error instanceof ApiError && error.code === "THREAD_CLOSED") markThreadClosed(t, false);
    } finally {
      button.disabled = Boolean(t.closed);
    }
  }

  async function loadThreads() {
    const mine = session;
    try {
      const page = await api("/v1/threads?page_size=100");
      if (mine !== session) return;
      $("thread-ids").replaceChildren(...page.threads.map((t) => el("option", { value: t.id })));
    } catch {
      // the list is a convenience: a thread id can still be typed
    }
  }

  // --- What waits for the caller's decision (other people's requests) ---------------------------------------

  // GET /v1/approvals: every operation waiting now that the caller may decide across their tenant. A caller's
  // own requests' writes are decided in their own cards (the list leaves them out); only a role lets anyone
  // decide another person's writes, so the list is read for callers with roles alone. It is read on logging
  // in, after each decision, on its Refresh button and every DECISIONS_MS while the tab is visible; never
  // twice at once.
  const decisions = new Map(); // "workflow_id/operation_id" -> {item, text, check, deciding, error, el}
  let decisionsLoading = false;
  let decisionsTimer = null;
  const approvalPath = (workflowId, operationId) =>
    `/v1/approvals/${encodeURIComponent(workflowId)}/${encodeURIComponent(operationId)}`;

  function decides() {
    return Boolean(me && me.roles.length);
  }

  async function loadDecisions() {
    if (decisionsLoading || !decides()) return;
    decisionsLoading = true;
    const mine = session;
    const errorNode = $("decisions-error");
    const button = $("decisions-refresh");
    button.disabled = true;
    try {
      const page = await api("/v1/approvals", { exactArguments: true });
      if (mine !== session) return;
      const items = (page.approvals || []).filter((item) => item.requester !== me.user_id);
      const cards = [];
      for (const item of items) {
        const key = `${item.workflow_id}/${item.operation.operation_id}`;
        const text = canonicalJson(item);
        let known = decisions.get(key);
        if (!known || known.text !== text) {
          known = { key, item, text, check: await digestCheck(item.operation), deciding: false, error: "" };
          if (mine !== session) return;
          known.el = buildDecisionCard(known);
          decisions.set(key, known);
        }
        cards.push(known);
      }
      const listed = new Set(cards.map((known) => known.key));
      for (const key of Array.from(decisions.keys())) if (!listed.has(key)) decisions.delete(key);
      $("decisions").replaceChildren(...cards.map((known) => known.el));
      // An incomplete list is never "nothing waits" (GET /v1/approvals, complete).
      const complete = page.complete !== false;
      $("decisions-empty").hidden = cards.length > 0 || !complete;
      $("decisions-incomplete").hidden = complete;
      showError(errorNode, "");
    } catch (error) {
      if (mine === session) showError(errorNode, `Could not list what waits for your decision: ${describe(error)}`);
    } finally {
      if (mine === session) {
        decisionsLoading = false;
        button.disabled = false;
      }
    }
  }

  function buildDecisionCard(known) {
    const { item } = known;
    const payload = item.operation;
    const target = payload.target || payload.tool;
    const titleId = `decide-${item.workflow_id}-${payload.operation_id}`;
    const card = el(
      "li",
      {
        className: "request decision",
        "data-workflow-id": item.workflow_id,
        "data-operation-id": payload.operation_id,
        "data-requester": item.requester,
        "data-digest": payload.digest,
        "data-check": known.check,
      },
      el(
        "article",
        { className: "approval", "aria-labelledby": titleId, role: "group" },
        el("h3", { id: titleId, "data-field": "decision-title", text: `${payload.tool} (${target}) for ${item.requester}` }),
        el(
          "dl",
          {},
          el("dt", { text: "Requested by" }),
          el("dd", { "data-field": "decision-requester", text: `${item.requester} in tenant ${payload.actor ? payload.actor.tenant_id : ""}` }),
          el("dt", { text: "Tool" }),
          el("dd", {}, el("code", { "data-field": "approval-tool", text: payload.tool })),
          el("dt", { text: "Request" }),
          el("dd", {}, el("code", { "data-field": "approval-target", text: target })),
          el("dt", { text: "Operation" }),
          el("dd", {}, el("code", { "data-field": "approval-operation", text: payload.operation_id })),
          el("dt", { text: "Workflow" }),
          el("dd", {}, el("code", { "data-field": "decision-workflow", text: item.workflow_id })),
          ...policyFacts(payload.policy),
          ...digestFacts(payload, known.check),
          el("dt", { text: "You decide as" }),
          el("dd", { "data-field": "approval-decider", text: $("who").dataset.actor || "" }),
        ),
        ...payloadParts(payload),
        decisionButtons(titleId, { approve: known.check === "mismatch", reject: false }, (decision) => decideFor(known, decision)),
        el("p", { className: "error", role: "alert", "data-field": "approval-error", hidden: true }),
      ),
    );
    updateExpiry(card);
    return card;
  }

  function noteDecided(text, failed = false) {
    const log = $("decided");
    log.prepend(el("li", { className: failed ? "failed" : null, text }));
    while (log.children.length > DECIDED_KEPT) log.lastElementChild.remove();
    log.hidden = false;
  }

  async function decideFor(known, decision) {
    if (known.deciding) return;
    if (decision === "approve" && known.check === "mismatch") return;
    const { item } = known;
    const payload = item.operation;
    const buttons = known.el.querySelectorAll("button[data-action]");
    const errorNode = field(known.el, "approval-error");
    known.deciding = true;
    for (const button of buttons) button.disabled = true;
    showError(errorNode, "");
    const mine = session;
    try {
      const receipt = await api(`${approvalPath(item.workflow_id, payload.operation_id)}/decision`, {
        method: "POST",
        body: { decision, digest: payload.digest },
      });
      if (mine !== session) return;
      const verb = decision === "approve" ? "Approved" : "Rejected";
      const by = receipt.approval ? `, recorded as decided by ${receipt.approval.by}` : "";
      const words = `${verb}: ${payload.tool} (${payload.target || payload.tool}) for ${item.requester}${by}; now ${receipt.state}`;
      noteDecided(words);
      announce(words);
      decisions.delete(known.key);
      known.el.remove();
      $("decisions-empty").hidden = $("decisions").children.length > 0;
    } catch (error) {
      if (mine !== session) return;
      // 404: it waits for the caller no more (decided by another, expired, its request finished). Said in the
      // card and in the log, which outlives the card when the list read next leaves it out.
      const words = decisionFailure(error);
      showError(errorNode, words);
      noteDecided(`${payload.tool} (${payload.target || payload.tool}) for ${item.requester}: ${words}`, true);
      for (const button of buttons) button.disabled = button.dataset.action === "approve" && known.check === "mismatch";
    } finally {
      known.deciding = false;
    }
    if (mine === session) loadDecisions();
  }

  function startDecisions() {
    clearInterval(decisionsTimer);
    decisionsTimer = null;
    $("decisions-section").hidden = !decides();
    if (!decides()) return;
    setText($("decisions-every"), String(DECISIONS_MS / 1000));
    loadDecisions();
    decisionsTimer = setInterval(() => {
      if (document.visibilityState === "visible") loadDecisions();
    }, DECISIONS_MS);
  }

  function stopDecisions() {
    clearInterval(decisionsTimer);
    decisionsTimer = null;
    decisions.clear();
    decisionsLoading = false;
    $("decisions").replaceChildren();
    $("decided").replaceChildren();
    $("decided").hidden = true;
    $("decisions-section").hidden = true;
    showError($("decisions-error"), "");
  }

  // --- Logging in and out ----------------------------------------------------------------------------------

  async function logIn(candidate, remember) {
    const errorNode = $("login-error");
    showError(errorNode, "");
    token = candidate;
    try {
      me = await api("/v1/me", { quiet401: true });
    } catch (error) {
      token = null;
      me = null;
      sessionStorage.removeItem(TOKEN_KEY);
      const words =
        error instanceof ApiError && error.status === 401
          ? "That token was not accepted. Check it and try again."
          : `Could not check the token: ${describe(error)}`;
      showError(errorNode, words);
      $("token").focus();
      return;
    }
    if (remember) sessionStorage.setItem(TOKEN_KEY, candidate);
    me = { user_id: me.user_id, tenant_id: me.tenant_id, roles: Array.isArray(me.roles) ? me.roles : [] };
    const who = $("who");
    who.dataset.state = "signed-in";
    who.dataset.user = me.user_id;
    who.dataset.tenant = me.tenant_id;
    who.dataset.actor = `${me.user_id} in tenant ${me.tenant_id}`;
    who.dataset.roles = me.roles.join(" ");
    const roles = me.roles.length ? ` (${me.roles.join(", ")})` : "";
    setText(who, `Logged in as ${me.user_id} in tenant ${me.tenant_id}${roles}`);
    $("token").value = "";
    $("login").hidden = true;
    $("logout").hidden = false;
    $("app").hidden = false;
    $("question").focus();
    loadThreads();
    startDecisions();
    await loadList();
  }

  function signedOut(message) {
    session += 1;
    token = null;
    me = null;
    sessionStorage.removeItem(TOKEN_KEY);
    stopDecisions();
    for (const req of requests.values()) {
      if (req.abort) req.abort.abort();
      clearTimeout(req.pollTimer);
    }
    requests.clear();
    closeThread();
    $("thread-ids").replaceChildren();
    $("thread-id").value = "";
    streamQueue.length = 0;
    nextPageToken = null;
    $("requests").replaceChildren();
    const who = $("who");
    who.dataset.state = "signed-out";
    delete who.dataset.user;
    delete who.dataset.tenant;
    delete who.dataset.actor;
    delete who.dataset.roles;
    setText(who, "Not logged in");
    $("logout").hidden = true;
    $("app").hidden = true;
    $("login").hidden = false;
    showError($("login-error"), message || "");
    $("token").focus();
  }

  function start() {
    $("login-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const candidate = $("token").value.trim();
      if (!candidate) {
        showError($("login-error"), "Type your API token first.");
        $("token").focus();
        return;
      }
      logIn(candidate, true);
    });
    $("logout").addEventListener("click", () => signedOut(""));
    $("ask-form").addEventListener("submit", ask);
    $("thread-form").addEventListener("submit", (event) => {
      event.preventDefault();
      openThread($("thread-id").value.trim());
    });
    $("thread-new").addEventListener("click", () => openThread(newKey().replace("web-", "thread-")));
    $("message-form").addEventListener("submit", sendMessage);
    $("thread-end").addEventListener("click", endThread);
    $("refresh").addEventListener("click", () => loadList());
    $("decisions-refresh").addEventListener("click", () => loadDecisions());
    $("more").addEventListener("click", () => loadList(true));
    setInterval(() => updateExpiry(document), 1000);
    const saved = sessionStorage.getItem(TOKEN_KEY);
    if (saved) logIn(saved, true);
    else $("token").focus();
  }

  start();
})();
