// The cluster console in a real headless browser: Debian's chromium (/usr/bin/chromium, or
// $CHROMIUM) driven by playwright-core, which downloads no browser. tests/it/console.rs runs
// it against live nodes; a person can too:
//
//   npm ci --prefix tests/browser
//   node tests/browser/console.mjs http://127.0.0.1:10921/ /tmp/out groups=g1,g2 screenshot=console
//
// Arguments: the page's URL, an output directory, then steps, run in order:
//   groups=G1,G2     until a card for each group names a master
//   master=G:OLD     until G's card names a master other than OLD, with no reload of the page
//   decision=G:KIND  until G's card lists a recent decision of KIND (failover, switchover, ...)
//   banner=NAME      until the banner NAME shows (stale: the node lost etcd; reconnecting: the
//                    event stream dropped; uncoordinated; paused)
//   screenshot=NAME  the whole page to OUT/NAME.png
// Options: --timeout-ms N (each step's bound, default 30000), --profile DIR (the browser's
// user-data-dir, which must be fresh; default a temp dir, removed at the end).
//
// Each step prints one JSON line: {"step", "ok", "ms", "seen"}, where "seen" is what the page
// shows (read from the DOM, as a person sees it). The first step that fails prints "ok": false
// with the error, writes OUT/failure.png and exits 1. The browser is closed in every case.

import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { chromium } from "playwright-core";

// On this kind of machine chromium's own connections out (updates, sync, QUIC probes) are
// refused en masse and slow it down: they are switched off.
const FLAGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--no-first-run",
  "--disable-quic",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

function parseArgs(argv) {
  const opts = { timeoutMs: 30000, profile: null, steps: [] };
  const rest = [];
  for (let i = 0; i < argv.length; i += 1) {
    const a = argv[i];
    if (a === "--timeout-ms") opts.timeoutMs = Number(argv[++i]);
    else if (a === "--profile") opts.profile = argv[++i];
    else rest.push(a);
  }
  if (rest.length < 2 || !Number.isFinite(opts.timeoutMs)) {
    console.error("usage: console.mjs URL OUT_DIR STEP... [--timeout-ms N] [--profile DIR]");
    process.exit(2);
  }
  [opts.url, opts.out] = rest;
  for (const s of rest.slice(2)) {
    const at = s.indexOf("=");
    if (at < 1) {
      console.error(`a step is NAME=VALUE: ${s}`);
      process.exit(2);
    }
    opts.steps.push({ name: s.slice(0, at), value: s.slice(at + 1) });
  }
  return opts;
}

// What the page shows, from the DOM only.
function seenInPage() {
  const text = (e) => (e ? e.textContent.trim() : null);
  const banners = {};
  for (const b of document.querySelectorAll("[data-banner]")) {
    banners[b.dataset.banner] = b.hidden ? null : text(b);
  }
  const groups = [...document.querySelectorAll("section.group")].map((c) => ({
    group: c.dataset.group,
    master: c.dataset.master || null,
    epoch: c.dataset.epoch === "" ? null : Number(c.dataset.epoch),
    phase: c.dataset.phase || null,
    failover: c.dataset.failover,
    failover_text: text(c.querySelector("[data-failover-text]")),
    title: text(c.querySelector("h2")),
    members: [...c.querySelectorAll("tr[data-member]")].map((r) => ({
      name: r.dataset.member,
      role: r.dataset.role || null,
      live: r.dataset.live === "true",
      cells: [...r.cells].map((td) => td.textContent.trim()),
    })),
    decisions: [...c.querySelectorAll("li[data-decision-epoch]")].map((li) => ({
      kind: li.dataset.kind || null,
      epoch: li.dataset.decisionEpoch === "" ? null : Number(li.dataset.decisionEpoch),
      text: text(li),
    })),
  }));
  return {
    updates: Number(document.body.dataset.updates),
    stream: document.body.dataset.stream,
    connected: document.body.dataset.connected,
    node: text(document.getElementById("node")),
    json_link: document.getElementById("json-link")?.getAttribute("href") ?? null,
    banners,
    groups,
    images: document.images.length,
    mark: window.__consoleMark ?? null,
  };
}

function cardHasMaster(names) {
  const cards = [...document.querySelectorAll("section.group")];
  return names.every((n) => cards.some((c) => c.dataset.group === n && c.dataset.master));
}

function masterMoved([group, old]) {
  const c = [...document.querySelectorAll("section.group")].find((x) => x.dataset.group === group);
  return Boolean(c && c.dataset.master && c.dataset.master !== old);
}

function decisionShown([group, kind]) {
  const c = [...document.querySelectorAll("section.group")].find((x) => x.dataset.group === group);
  return Boolean(c && [...c.querySelectorAll("li[data-kind]")].some((li) => li.dataset.kind === kind));
}

function bannerShown(name) {
  const b = document.querySelector(`[data-banner="${name}"]`);
  return Boolean(b && !b.hidden);
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  mkdirSync(opts.out, { recursive: true });
  const ownProfile = opts.profile === null;
  const profile = ownProfile ? mkdtempSync(join(tmpdir(), "hasync-console-")) : opts.profile;
  const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
  let context = null;
  let failed = false;
  const stop = async () => {
    if (context) await context.close().catch(() => {});
    if (ownProfile) rmSync(profile, { recursive: true, force: true });
  };
  for (const sig of ["SIGTERM", "SIGINT"]) {
    process.on(sig, () => stop().finally(() => process.exit(1)));
  }
  try {
    context = await chromium.launchPersistentContext(profile, {
      executablePath,
      headless: true,
      args: FLAGS,
      viewport: { width: 1440, height: 900 },
      timeout: opts.timeoutMs,
    });
    const page = context.pages()[0] ?? (await context.newPage());
    const origin = new URL(opts.url).origin;
    const outside = [];
    const errors = [];
    let loads = 0;
    page.on("request", (r) => {
      const u = new URL(r.url());
      if (!["data:", "about:"].includes(u.protocol) && u.origin !== origin) outside.push(r.url());
    });
    page.on("pageerror", (e) => errors.push(`page error: ${e.message}`));
    page.on("console", (m) => {
      if (m.type() === "error") errors.push(`console: ${m.text()}`);
    });
    page.on("load", () => {
      loads += 1;
    });
    const started = Date.now();
    await page.goto(opts.url, { timeout: opts.timeoutMs, waitUntil: "load" });
    // A reload would lose this mark.
    await page.evaluate(() => {
      window.__consoleMark = "not reloaded";
    });
    const report = async (step, ok, extra) => {
      const seen = await page.evaluate(seenInPage).catch((e) => ({ unreadable: String(e) }));
      const line = { step, ok, ms: Date.now() - started, loads, outside, errors, seen, ...extra };
      console.log(JSON.stringify(line));
    };
    const wait = (fn, arg) => page.waitForFunction(fn, arg, { timeout: opts.timeoutMs, polling: 100 });
    for (const { name, value } of opts.steps) {
      try {
        if (name === "groups") {
          await wait(cardHasMaster, value.split(",").filter(Boolean));
          await report(name, true);
        } else if (name === "master") {
          const at = value.lastIndexOf(":");
          await wait(masterMoved, [value.slice(0, at), value.slice(at + 1)]);
          const kept = await page.evaluate(() => window.__consoleMark === "not reloaded");
          if (!kept || loads !== 1) throw new Error(`the page was reloaded (loads ${loads})`);
          await report(name, true);
        } else if (name === "decision") {
          const at = value.lastIndexOf(":");
          await wait(decisionShown, [value.slice(0, at), value.slice(at + 1)]);
          await report(name, true);
        } else if (name === "banner") {
          await wait(bannerShown, value);
          await report(name, true);
        } else if (name === "screenshot") {
          const path = resolve(opts.out, `${value}.png`);
          await page.screenshot({ path, fullPage: true });
          await report(name, true, { path });
        } else {
          throw new Error(`unknown step ${name}`);
        }
      } catch (e) {
        failed = true;
        const path = resolve(opts.out, "failure.png");
        await page.screenshot({ path, fullPage: true }).catch(() => {});
        await report(name, false, { error: String(e.message || e), path });
        break;
      }
    }
  } catch (e) {
    failed = true;
    console.log(JSON.stringify({ step: "launch", ok: false, error: String(e.message || e) }));
  } finally {
    await stop();
  }
  process.exit(failed ? 1 : 0);
}

main();
