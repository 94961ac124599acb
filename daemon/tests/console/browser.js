// Drives the operator console in headless Chromium (Playwright's playwright-core with the
// system browser) against a running 2-instance cluster; started by console_browser.rs,
// which passes everything in the environment and checks the JSON printed on the last line.
// The cluster's state is checked through the API, never only through the page.
"use strict";

const path = require("path");
const { chromium } = require(path.join(process.env.PLAYWRIGHT_CORE_DIR, "node_modules", "playwright-core"));

const A = process.env.CONSOLE_A; // the instance serving the page
const B = process.env.CONSOLE_B; // the instance that is killed
const TOKEN = process.env.CONSOLE_TOKEN;
const PID_B = Number(process.env.CONSOLE_PID_B);
const SERVICES = process.env.CONSOLE_SERVICES.split(",");
const BUSY = process.env.CONSOLE_BUSY;
const PINNED = process.env.CONSOLE_PINNED;
const SHOTS = process.env.CONSOLE_SCREENSHOTS;

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const started = Date.now();
const seconds = (since) => Number(((Date.now() - since) / 1000).toFixed(2));
function log(message) {
  console.error(`[${seconds(started).toFixed(2)} s] ${message}`);
}

async function api(base, route) {
  const response = await fetch(base + route, { headers: { Authorization: "Bearer " + TOKEN } });
  if (!response.ok) throw new Error(`${route}: ${response.status} ${await response.text()}`);
  return response.json();
}

async function until(what, timeoutMs, check) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(100);
  }
}

async function main() {
  const result = {};
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM_PATH,
    headless: true,
    args: ["--no-sandbox", "--disable-dev-shm-usage"],
  });
  const page = await browser.newPage({ viewport: { width: 1440, height: 1000 } });
  page.on("pageerror", (error) => log("page error: " + error.message));
  const offsite = [];
  page.on("request", (request) => {
    if (!request.url().startsWith(A)) offsite.push(request.url());
  });

  // 1. The overview lists the services (after the token is entered).
  let t = Date.now();
  await page.goto(A + "/console/");
  await page.waitForSelector("#live.error", { timeout: 30000 }); // asks for the token
  await page.fill("#token", TOKEN);
  await page.click("#token-form button");
  for (const service of SERVICES) {
    await page.waitForSelector(`tr[data-service="${service}"]`, { timeout: 30000 });
  }
  await page.waitForSelector("tr[data-instance]", { timeout: 30000 });
  result.overview_listed_s = seconds(t);
  result.instances_listed = await page.locator("tr[data-instance]").count();
  log(`overview lists ${SERVICES.length} services and ${result.instances_listed} instances`);
  await sleep(1500); // a few polls, so the throughput chart has data
  await page.screenshot({ path: path.join(SHOTS, "overview.png"), fullPage: true });

  // 2. Pausing the busy service from its page stops its submission.
  const counts = async () => (await api(A, "/api/v1/services/" + encodeURIComponent(BUSY))).counts;
  const moving = await counts();
  await until("the busy service to be submitting", 15000, async () => (await counts()).COMMITTED > moving.COMMITTED);
  await page.goto(A + "/console/#/service/" + encodeURIComponent(BUSY));
  await page.waitForSelector("#batches tr[data-batch]", { timeout: 30000 });
  t = Date.now();
  await page.click("#pause");
  await page.waitForSelector('#report[data-state="executed"]', { timeout: 30000 });
  result.pause_report = await page.textContent("#report");
  result.pause_answered_s = seconds(t);
  const service = await api(A, "/api/v1/services/" + encodeURIComponent(BUSY));
  if (!service.paused) throw new Error("the API does not show the service paused");
  // A POST in flight at the pause finishes; after that nothing more may start.
  await sleep(1500);
  const first = await counts();
  await sleep(2500);
  const second = await counts();
  result.pause = { before: moving, after_1_5_s: first, after_4_s: second };
  log(`paused: QUEUED ${first.QUEUED} then ${second.QUEUED}, SUBMITTING ${second.SUBMITTING}`);
  if (!(first.QUEUED > 0 && first.QUEUED === second.QUEUED && second.SUBMITTING === 0)) {
    throw new Error("submission went on after the pause: " + JSON.stringify(result.pause));
  }
  await page.waitForSelector("#service-state .tag.warn", { timeout: 15000 });
  await page.screenshot({ path: path.join(SHOTS, "service-paused.png"), fullPage: false });
  // Resume: the queue moves again.
  await page.click("#resume");
  await page.waitForSelector('#report[data-state="executed"]:has-text("resume")', { timeout: 30000 });
  await until("the busy service to move after resume", 15000, async () => (await counts()).QUEUED < second.QUEUED);
  log("resumed: the queue moves again");
  // max_in_flight: a refused value is shown as refused, a valid one as executed.
  await page.fill("#mif", "0");
  await page.click("#set-mif");
  await page.waitForSelector('#report[data-state="error"]:has-text("max_in_flight")', { timeout: 30000 });
  await page.fill("#mif", "2");
  await page.click("#set-mif");
  await page.waitForSelector('#report[data-state="executed"]:has-text("max_in_flight")', { timeout: 30000 });
  if ((await api(A, "/api/v1/services/" + encodeURIComponent(BUSY))).max_in_flight !== 2) {
    throw new Error("max_in_flight set on the page is not 2 in the API");
  }
  result.max_in_flight_report = await page.textContent("#report");

  // The batch page: its full history.
  const firstBatch = await page.getAttribute("#batches tr[data-batch] a", "href");
  await page.goto(A + "/console/" + firstBatch);
  await page.waitForSelector("#history tr td", { timeout: 30000 });
  await page.screenshot({ path: path.join(SHOTS, "batch.png"), fullPage: false });

  // 3. Killing an instance moves its claims, and the page shows the new holder.
  const instances = (await api(A, "/api/v1/instances")).instances;
  const victim = instances.find((i) => i.pid === PID_B);
  const survivor = instances.find((i) => i.pid !== PID_B);
  if (!victim || !survivor) throw new Error("instances not found: " + JSON.stringify(instances));
  const claims = (await api(A, "/api/v1/claims")).claims;
  const moved = claims.find((c) => c.claimant === victim.instance_id && c.service_id !== PINNED && c.service_id !== BUSY);
  if (!moved) throw new Error("the victim holds no unpinned service: " + JSON.stringify(claims));
  await page.goto(A + "/console/#/");
  await page.waitForSelector(`tr[data-service="${moved.service_id}"] td[data-holder="${victim.instance_id}"]`, { timeout: 30000 });
  log(`killing ${victim.instance_id}, which holds ${moved.service_id}`);
  t = Date.now();
  process.kill(PID_B, "SIGKILL");
  await page.waitForSelector(`tr[data-service="${moved.service_id}"] td[data-holder="${survivor.instance_id}"]`, { timeout: 30000 });
  result.kill = {
    service: moved.service_id,
    from: victim.instance_id,
    to: survivor.instance_id,
    page_shows_new_holder_s: seconds(t),
  };
  log(`the page shows ${survivor.instance_id} holding ${moved.service_id} ${result.kill.page_shows_new_holder_s} s after the kill`);
  // Every claim of the dead instance moved (checked through the API), and the service
  // pinned to the dead instance's label shows up as unserved.
  // (except the pinned one: no live instance may take it, so its expired claim stays).
  await until("every claim of the dead instance to move", 30000, async () =>
    !(await api(A, "/api/v1/claims")).claims.some((c) => c.claimant === victim.instance_id && c.service_id !== PINNED));
  result.kill.all_claims_moved_s = seconds(t);
  await page.waitForSelector('#unserved[data-unserved="1"]', { timeout: 15000 });
  await page.waitForSelector(`tr[data-service="${PINNED}"] [data-unserved-service]`, { timeout: 15000 });
  result.kill.unserved_shown_s = seconds(t);
  // The dead instance shows as silent until the leader prunes it from the registry.
  await until("the dead instance to show as silent or gone", 15000, async () =>
    (await page.locator(`tr[data-instance="${victim.instance_id}"]:not(.stale)`).count()) === 0);
  await page.screenshot({ path: path.join(SHOTS, "overview-after-kill.png"), fullPage: true });

  result.offsite_requests = offsite;
  result.total_s = seconds(started);
  await browser.close();
  console.log(JSON.stringify(result));
}

main().catch((error) => {
  console.error("browser test failed: " + (error.stack || error));
  process.exit(1);
});
