// kernelbox JavaScript/TypeScript kernel driver (docs/contract.md, "JavaScript and TypeScript").
//
// Node's standard library only. Started by the Python runner (runner/kernel_runner.py, _Node)
// as `node --expose-internals --experimental-vm-modules node_kernel.js LANGUAGE`, a persistent child that evaluates cells;
// the runner keeps the protocol with the host (frames, markers, display caps, limits). Fds:
//   1, 2  the cell's stdout and stderr (the runner's output pipe and its stderr relay; console
//         and process.stdout/stderr write on close-on-exec copies of them);
//   3     commands from the runner, one JSON line each: {"code": str, "cell": N, "nonce": str};
//   4     messages to the runner, one JSON line each: {"op": "ready"}, and per cell
//         {"op": "display", "nonce", "data", "metadata", "main"} (answered by one byte on
//         fd 5 once shown, so a display lands between the cell's output in write order)
//         then {"op": "done", "nonce", "status", "ename", "evalue", "traceback"};
//   5     the runner's acknowledgements of displays.
// Each is reopened close-on-exec at start (processes a cell starts do not inherit them).
//
// Cells run as consecutive scripts in the main context (as Node's REPL does): top-level
// let/const/class/function persist; a cell using `await` at top level is rewritten by Node's
// own REPL transform (internal/repl/await). A synchronous cell is interruptible (vm's
// breakOnSigint); an awaiting one is abandoned on SIGINT (its promise keeps running).
'use strict';

const fs = require('fs');
const vm = require('vm');
const util = require('util');
const path = require('path');
const Module = require('module');
const { Writable } = require('stream');

const LANGUAGE = process.argv[2] === 'typescript' ? 'typescript' : 'javascript';
const stringify = JSON.stringify;
const parse = JSON.parse;
const inspect = util.inspect;
const writeSync = fs.writeSync;
const readSync = fs.readSync;
const BufferFrom = Buffer.from;
const isBuffer = Buffer.isBuffer;
// The built-ins the driver awaits with, taken before any cell can replace them (a cell that
// reassigns setImmediate or Promise.race must not wedge the end of every later cell).
const PromiseRace = Promise.race.bind(Promise);
const PromiseResolve = Promise.resolve.bind(Promise);
const setImmediateNow = setImmediate;
const PromiseCtor = Promise;
const thenOf = Function.prototype.call.bind(Promise.prototype.then);
// The longest error name, message and traceback the driver reports: a cell throwing a huge
// message still ends with a message line the runner reads (the whole text is not kept).
const MAX_ERROR_TEXT = 64 * 1024;

function capText(text) {
  return text.length > MAX_ERROR_TEXT ? text.slice(0, MAX_ERROR_TEXT) + '...(cut)' : text;
}

// A close-on-exec copy of `fd` (libuv opens with O_CLOEXEC); `fd` itself is closed when
// `close`. Where /proc cannot reopen it, `fd` stays as it is.
function reopen(fd, flags, close) {
  let fresh;
  try {
    fresh = fs.openSync('/proc/self/fd/' + fd, flags);
  } catch (e) {
    return fd;
  }
  if (close) fs.closeSync(fd);
  return fresh;
}
const { O_RDONLY, O_WRONLY } = fs.constants;
const CMD = reopen(3, O_RDONLY, true);
const STATUS = reopen(4, O_WRONLY, true);
const ACK = reopen(5, O_RDONLY, true);
// Private copies of the output pipe and the stderr relay: console output still arrives after
// a cell closed fds 1 and 2 (which processes a cell starts inherit).
const OUT = reopen(1, O_WRONLY, false);
const ERR = reopen(2, O_WRONLY, false);

function writeAll(fd, data) {
  let buf = typeof data === 'string' ? BufferFrom(data, 'utf8') : data;
  while (buf.length > 0) {
    let n;
    try {
      n = writeSync(fd, buf);
    } catch (e) {
      if (e && e.code === 'EAGAIN') {
        Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 1);
        continue;
      }
      if (fd === STATUS) process.exit(70); // the runner is gone: nothing to report to
      return;
    }
    buf = buf.subarray(n);
  }
}

// Messages are objects without a prototype (`__proto__: null` literals): a cell's
// Object.prototype.toJSON never changes what the runner reads.
function send(msg) {
  const line = stringify(msg);
  writeAll(STATUS, (typeof line === 'string' ? line : '{}') + '\n');
}

// process.stdout and process.stderr write synchronously on fds 1 and 2, as console does:
// output is on the pipe, in order, before the cell's end is reported, and Node never turns
// the shared pipes non-blocking.
function syncStream(fd) {
  const stream = new Writable({
    decodeStrings: false,
    write(chunk, encoding, callback) {
      writeAll(fd, typeof chunk === 'string' ? BufferFrom(chunk, encoding) : chunk);
      callback();
    },
  });
  stream.fd = fd === OUT ? 1 : 2;
  stream.isTTY = false;
  stream._isStdio = true;
  stream.destroySoon = stream.destroy;
  stream._destroy = (err, cb) => cb(err);
  return stream;
}
const stdout = syncStream(OUT);
const stderr = syncStream(ERR);
Object.defineProperty(process, 'stdout', { configurable: true, enumerable: true, get: () => stdout });
Object.defineProperty(process, 'stderr', { configurable: true, enumerable: true, get: () => stderr });
globalThis.console = new console.Console({ stdout, stderr, colorMode: false });

// Node's REPL rewrite for top-level await (lib/internal/repl/await.js), when present.
let processTopLevelAwait = null;
try {
  processTopLevelAwait = require('internal/repl/await').processTopLevelAwait;
} catch (e) {
  processTopLevelAwait = null;
}

let ts = null;
if (LANGUAGE === 'typescript') {
  for (const name of ['typescript', '/usr/share/nodejs/typescript', '/usr/lib/nodejs/typescript']) {
    try {
      ts = require(name);
      break;
    } catch (e) {
      // next
    }
  }
  if (ts === null) {
    process.stderr.write('kernelbox: the TypeScript compiler is not installed in this image\n');
    process.exit(71);
  }
}

// Types stripped per cell; type errors never block (transpileModule checks syntax only, and
// a syntax error is the cell's SyntaxError).
function transpile(code) {
  const out = ts.transpileModule(code, {
    reportDiagnostics: true,
    fileName: 'cell.ts',
    compilerOptions: {
      target: ts.ScriptTarget.ES2022,
      module: ts.ModuleKind.CommonJS,
      esModuleInterop: true,
      isolatedModules: true,
      sourceMap: false,
    },
  });
  for (const d of out.diagnostics || []) {
    if (d.category !== ts.DiagnosticCategory.Error) continue;
    let where = '';
    if (d.file && typeof d.start === 'number') {
      const at = d.file.getLineAndCharacterOfPosition(d.start);
      where = ' (line ' + (at.line + 1) + ', column ' + (at.character + 1) + ')';
    }
    throw new SyntaxError('TS' + d.code + ': ' + ts.flattenDiagnosticMessageText(d.messageText, '\n') + where);
  }
  return out.outputText;
}
if (ts !== null) {
  // The compiler's first run is several times slower than the next ones: paid before ready.
  transpile('interface P { x: number }\nenum E { A }\nconst p: P = { x: 1 };\nasync function f<T>(v: T): Promise<T> { return v; }\nf(p).then(() => E.A);\n');
}

// A cell's `require` resolves from the working directory (/work), as a script there would.
let requireDir = null;
function cellRequire() {
  const cwd = process.cwd();
  if (requireDir !== cwd) {
    requireDir = cwd;
    globalThis.require = Module.createRequire(path.join(cwd, '[cell]'));
  }
}
globalThis.module = { exports: {} };
globalThis.exports = globalThis.module.exports;
globalThis.__filename = '[cell]';
globalThis.__dirname = process.cwd();

function importer(specifier) {
  if (specifier.startsWith('./') || specifier.startsWith('../')) {
    specifier = path.resolve(process.cwd(), specifier);
  }
  return import(specifier);
}

// ---- results and displays ---------------------------------------------------------------

const MIME_SYMBOL = Symbol.for('kernelbox.mime');
const REPR_METHODS = [
  ['image/png', '_repr_png_'],
  ['image/jpeg', '_repr_jpeg_'],
  ['image/svg+xml', '_repr_svg_'],
  ['text/html', '_repr_html_'],
  ['text/markdown', '_repr_markdown_'],
  ['text/latex', '_repr_latex_'],
  ['application/json', '_repr_json_'],
];

function mimeValue(mime, value) {
  if (isBuffer(value) || value instanceof Uint8Array) {
    return BufferFrom(value.buffer, value.byteOffset, value.byteLength).toString('base64');
  }
  if (typeof value === 'string') return value;
  if (mime === 'application/json' || mime.endsWith('+json')) return value;
  return String(value);
}

// A value's MIME bundle: text/plain from util.inspect, plus what the value offers through
// [Symbol.for('kernelbox.mime')]() (an object {mime: data}) or IPython-style _repr_*_ methods.
function bundleOf(value) {
  const data = { __proto__: null };
  if (value !== null && (typeof value === 'object' || typeof value === 'function')) {
    try {
      if (typeof value[MIME_SYMBOL] === 'function') {
        const offered = value[MIME_SYMBOL]();
        if (offered && typeof offered === 'object') {
          for (const mime of Object.keys(offered)) data[mime] = mimeValue(mime, offered[mime]);
        }
      } else if (typeof value._repr_mimebundle_ === 'function') {
        const offered = value._repr_mimebundle_();
        if (offered && typeof offered === 'object') {
          for (const mime of Object.keys(offered)) data[mime] = mimeValue(mime, offered[mime]);
        }
      }
      for (const [mime, method] of REPR_METHODS) {
        if (!(mime in data) && typeof value[method] === 'function') {
          const offered = value[method]();
          if (offered !== undefined && offered !== null) data[mime] = mimeValue(mime, offered);
        }
      }
    } catch (e) {
      data['text/plain'] = inspect(value) + '\n[a MIME method raised: ' + errorText(e) + ']';
    }
  }
  if (!('text/plain' in data)) data['text/plain'] = typeof value === 'string' ? inspect(value) : inspect(value);
  return data;
}

let current = null; // the running cell: {nonce, fail}

function display(value, options) {
  if (current === null) return; // no cell: a stray timer's display belongs to nobody
  const raw = options && options.raw;
  const data = raw && value && typeof value === 'object' ? value : bundleOf(value);
  const metadata = (options && options.metadata) || {};
  showBundle(data, metadata, false);
}

function showBundle(data, metadata, main) {
  send({ __proto__: null, op: 'display', nonce: current.nonce, data, metadata, main });
  const one = Buffer.alloc(1);
  for (;;) {
    try {
      if (readSync(ACK, one, 0, 1, null) === 1) return;
      process.exit(70);
    } catch (e) {
      if (e && e.code === 'EAGAIN') continue;
      process.exit(70);
    }
  }
}
globalThis.display = display;

// ---- errors ---------------------------------------------------------------------------------

function errorText(e) {
  try {
    if (e instanceof Error || (e && typeof e === 'object' && typeof e.message === 'string')) return String(e.message);
    return typeof e === 'string' ? e : inspect(e);
  } catch (x) {
    return '<the thrown value could not be shown>';
  }
}

function errorName(e) {
  try {
    if (e && typeof e === 'object') {
      const name = e.name || (e.constructor && e.constructor.name);
      if (typeof name === 'string' && name) return name.slice(0, 200);
    }
  } catch (x) {
    // fall through
  }
  return 'Uncaught';
}

const DRIVER_FRAME = __filename;

// The stack without the driver's frames (everything from the first of them on).
function traceback(e) {
  let stack = null;
  try {
    stack = e && typeof e === 'object' && typeof e.stack === 'string' ? e.stack : null;
  } catch (x) {
    stack = null;
  }
  if (stack === null) return 'Uncaught ' + capText(typeof e === 'string' ? inspect(e) : errorText(e)) + '\n';
  if (stack.length > 4 * MAX_ERROR_TEXT) stack = stack.slice(0, 4 * MAX_ERROR_TEXT);
  const lines = stack.split('\n');
  const kept = [];
  for (const line of lines) {
    if (line.includes(DRIVER_FRAME) || line.includes('node:vm:') || line.includes('(node:internal/vm')) break;
    kept.push(line);
  }
  return kept.join('\n') + '\n';
}

function failure(e, status) {
  let ename = 'Uncaught';
  let evalue = '';
  let tb = 'Uncaught\n';
  try {
    ename = errorName(e);
    evalue = capText(errorText(e));
    tb = traceback(e);
    if (tb.length > MAX_ERROR_TEXT) tb = '...(cut)\n' + tb.slice(tb.length - MAX_ERROR_TEXT);
  } catch (x) {
    // a cell that replaced the built-ins these use: the placeholders above
  }
  return { __proto__: null, status, ename, evalue, traceback: tb };
}

// ---- cells ----------------------------------------------------------------------------------

class Interrupted extends Error {}
Interrupted.prototype.name = 'Interrupted';

// Code that reads as a block but is an object literal ({a: 1}) is taken as one, as the REPL does.
function asExpression(code) {
  if (/^\s*\{/.test(code) && /\}\s*;?\s*$/.test(code)) {
    const wrapped = '(' + code.replace(/;\s*$/, '') + '\n)';
    try {
      new vm.Script(wrapped);
      return wrapped;
    } catch (e) {
      return code;
    }
  }
  return code;
}

async function runCell(msg) {
  let code = typeof msg.code === 'string' ? msg.code : '';
  const filename = 'cell-' + msg.cell;
  let settle;
  const stopped = new PromiseCtor((resolve) => {
    settle = resolve;
  });
  const cell = { nonce: msg.nonce, failed: null };
  cell.fail = (o) => {
    if (cell.failed === null) {
      cell.failed = o;
      settle(o);
    }
  };
  current = cell;
  let outcome;
  try {
    cellRequire();
    if (ts !== null) code = transpile(code);
    code = asExpression(code);
    let awaited = false;
    if (processTopLevelAwait !== null && code.includes('await')) {
      try {
        const wrapped = processTopLevelAwait(code);
        if (wrapped !== null) {
          code = wrapped;
          awaited = true;
        }
      } catch (e) {
        // not valid with await either: the script below reports the syntax error
      }
    }
    const script = new vm.Script(code, { filename, importModuleDynamically: importer });
    let value = script.runInThisContext({ breakOnSigint: true, displayErrors: false });
    if (awaited) {
      const result = await PromiseRace([PromiseResolve(value), thenOf(stopped, (o) => {
        throw o;
      })]);
      value = result === undefined || result === null ? undefined : result.value;
    }
    // Rejections nobody handled during the cell surface before it ends (one turn of the loop).
    await new PromiseCtor((resolve) => setImmediateNow(resolve));
    outcome = cell.failed;
    if (outcome === null) {
      outcome = { __proto__: null, status: 'ok' };
      if (value !== undefined) showBundle(bundleOf(value), {}, true);
    }
  } catch (e) {
    if (e && e.__kernelbox_outcome) {
      outcome = e;
    } else if (e instanceof Error && /^Script execution was interrupted by `SIGINT`/.test(e.message)) {
      outcome = failure(new Interrupted('the cell was interrupted'), 'interrupted');
    } else {
      outcome = failure(e, 'error');
    }
  }
  current = null;
  send({
    __proto__: null,
    op: 'done',
    nonce: msg.nonce,
    status: outcome.status,
    ename: outcome.ename || null,
    evalue: outcome.evalue === undefined ? null : outcome.evalue,
    traceback: outcome.traceback || null,
  });
}

function failCurrent(e, status) {
  if (current === null) return false;
  const outcome = failure(e, status);
  outcome.__kernelbox_outcome = true;
  current.fail(outcome);
  return true;
}

process.on('SIGINT', () => {
  failCurrent(new Interrupted('the cell was interrupted while awaiting'), 'interrupted');
});
process.on('unhandledRejection', (reason) => {
  if (!failCurrent(reason, 'error')) {
    writeAll(ERR, 'Unhandled rejection (between cells): ' + traceback(reason));
  }
});
process.on('uncaughtException', (e) => {
  if (!failCurrent(e, 'error')) {
    writeAll(ERR, 'Uncaught exception (between cells): ' + traceback(e));
  }
});

// ---- the command loop -------------------------------------------------------------------

const queue = [];
let running = false;
let pending = Buffer.alloc(0);

async function drain() {
  if (running) return;
  running = true;
  while (queue.length > 0) {
    await runCell(queue.shift());
  }
  running = false;
}

const net = require('net');
const commands = new net.Socket({ fd: CMD, readable: true, writable: false });
commands.on('data', (chunk) => {
  pending = Buffer.concat([pending, chunk]);
  let at;
  while ((at = pending.indexOf(10)) >= 0) {
    const line = pending.subarray(0, at).toString('utf8');
    pending = pending.subarray(at + 1);
    let msg;
    try {
      msg = parse(line);
    } catch (e) {
      continue;
    }
    if (msg && typeof msg === 'object') queue.push(msg);
  }
  drain();
});
commands.on('end', () => process.exit(0));
commands.on('error', () => process.exit(0));

send({ __proto__: null, op: 'ready', node: process.version, language: LANGUAGE });
