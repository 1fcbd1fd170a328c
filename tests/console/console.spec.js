// The console in headless Chromium (Debian's /usr/bin/chromium, driven by
// playwright-core; no browser is downloaded). Run by integration_console_api
// against a host it started, with a dead letter (LETTER_KEY) whose remote is
// fixed and an unknown claim (UNKNOWN_KEY):
//   - a viewer logs in, opens the letter, and its replay is refused (403);
//   - an operator finds the letter, replays it as a dry run, then for real,
//     and sees its record done;
//   - the operator resolves the unknown as done, with a note;
//   - the operator log shows the actions.
// Screenshots of each step go to SCREENSHOTS. Exit 0 when all held.
'use strict';

const path = require('path');
const {chromium} = require(path.join(process.env.CONSOLE_TOOLS, 'node_modules', 'playwright-core'));

const url = process.env.CONSOLE_URL;
const shots = process.env.SCREENSHOTS;
let step = 0;

async function shot(page, name) {
  await page.screenshot({path: path.join(shots, `${String(++step).padStart(2, '0')}-${name}.png`), fullPage: true});
}

async function login(browser, token) {
  const page = await (await browser.newContext({viewport: {width: 1366, height: 768}})).newPage();
  page.on('pageerror', (e) => { throw new Error('page error: ' + e.message); });
  await page.goto(url + '/#/login');
  await page.getByTestId('token').fill(token);
  await page.getByTestId('login').click();
  await page.getByTestId('who').filter({hasText: '('}).waitFor();
  return page;
}

async function act(page, testid, note) {
  await page.getByTestId(testid + '-note').fill(note);
  await page.getByTestId(testid).click();
}

function expect(cond, what) {
  if (!cond) throw new Error('expected ' + what);
}

(async () => {
  const browser = await chromium.launch({
    executablePath: '/usr/bin/chromium',
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update',
      '--no-first-run', '--disable-sync'],
  });
  try {
    // A viewer sees everything and may change nothing.
    const viewer = await login(browser, process.env.VIEWER_TOKEN);
    await viewer.getByTestId('route-waybill').waitFor();
    await shot(viewer, 'viewer-routes');
    await viewer.goto(url + '/#/letters?route=waybill');
    await viewer.getByTestId('open-letter-' + process.env.LETTER_KEY).click();
    await act(viewer, 'replay', 'a viewer tries');
    const refused = viewer.getByTestId('flash-error');
    await refused.waitFor();
    expect((await refused.textContent()).includes('403'), 'the viewer\'s replay refused with 403');
    await shot(viewer, 'viewer-refused');

    // An operator replays the letter: a dry run, then for real.
    const op = await login(browser, process.env.OPERATOR_TOKEN);
    await op.goto(url + '/#/letters?route=waybill');
    await op.getByTestId('open-letter-' + process.env.LETTER_KEY).click();
    await op.getByTestId('letter-value').waitFor();
    expect((await op.getByTestId('letter-claim-status').textContent()) === 'failed', 'the letter\'s claim failed');
    await shot(op, 'letter');
    // A done action re-renders its page: the next note is typed into the
    // new form, not into one about to be replaced (it would be lost).
    const beforeDryRun = await op.getByTestId('replay').elementHandle();
    await act(op, 'replay-dry', 'what would go');
    await op.getByTestId('flash-info').filter({hasText: 'would be'}).waitFor();
    await op.waitForFunction((el) => !el.isConnected, beforeDryRun);
    await act(op, 'replay', 'the carrier is back');
    await op.getByTestId('flash-info').filter({hasText: ', 1 re-opened'}).waitFor();
    for (let i = 0; i < 60; ++i) {
      await op.reload();
      await op.getByTestId('letter-claim-status').waitFor();
      if ((await op.getByTestId('letter-claim-status').textContent()) === 'done') break;
      await op.waitForTimeout(500);
    }
    expect((await op.getByTestId('letter-claim-status').textContent()) === 'done', 'the replayed record done');
    await shot(op, 'replayed-done');

    // The operator settles the unknown text.
    await op.goto(url + '/#/unknowns');
    await op.getByTestId('open-unknown-' + process.env.UNKNOWN_KEY).click();
    await op.getByTestId('hook-answer').waitFor();
    await shot(op, 'unknown');
    await act(op, 'resolve-done', 'the gateway log shows it sent');
    await op.getByTestId('flash-info').filter({hasText: 'resolved as done'}).waitFor();
    await op.getByTestId('unknown-status').filter({hasText: 'done'}).waitFor();
    await shot(op, 'resolved');

    await op.goto(url + '/#/log');
    await op.getByTestId('log-unknown.resolve').waitFor();
    await op.getByTestId('log-letters.replay').waitFor();
    await shot(op, 'operator-log');
    console.log('console: all steps passed; screenshots in ' + shots);
  } finally {
    await browser.close();
  }
})().catch((e) => {
  console.error('console test failed: ' + (e.stack || e));
  process.exit(1);
});
