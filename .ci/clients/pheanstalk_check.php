<?php
// End-to-end check of a running server with the stock pheanstalk client
// (Debian's php-pda-pheanstalk, pheanstalk 4.x).
//
// Usage: php pheanstalk_check.php PORT [--extensions]
//        (server on 127.0.0.1:PORT; --extensions: delayq's job options too)
//
// The autoloader is looked for in $PHEANSTALK_AUTOLOAD, then in Debian's
// /usr/share/php/Pheanstalk/autoload.php, then in a composer vendor/ tree.
//
// A producer and a worker connection do a full round trip on a tube of
// their own: priorities and FIFO order, a 1-second delay, release,
// bury/kick, kick-job, touch, DEADLINE_SOON, stats-job, stats-tube,
// use/watch/ignore, pause-tube, and NOT_FOUND errors. It passes against
// beanstalkd 1.12 and must pass against delayq.
//
// Prints one line per failed check and, at the end, `pheanstalk: N passed,
// M failed`. Exits 0 only when nothing failed. Runs in about 1.5 s; a hard
// alarm stops it after 30 s so CI never hangs on it.

$candidates = array_filter([
    getenv('PHEANSTALK_AUTOLOAD') ?: null,
    '/usr/share/php/Pheanstalk/autoload.php',
    __DIR__ . '/vendor/autoload.php',
]);
$autoload = null;
foreach ($candidates as $c) {
    if (is_file($c)) {
        $autoload = $c;
        break;
    }
}
if ($autoload === null) {
    fwrite(STDERR, "pheanstalk autoloader not found (looked in: " . implode(', ', $candidates) . ");\n"
        . "install it with: apt-get install php-cli php-pda-pheanstalk\n");
    echo "pheanstalk: 0 passed, 1 failed\n";
    exit(2);
}
require $autoload;

use Pheanstalk\Exception\DeadlineSoonException;
use Pheanstalk\Exception\JobNotFoundException;
use Pheanstalk\Exception\ServerException;
use Pheanstalk\Job;
use Pheanstalk\JobId;
use Pheanstalk\Pheanstalk;

$PASSED = 0;
$FAILED = 0;
$SKIPPED = 0;

function ok(string $name, bool $cond, string $detail = ''): bool
{
    global $PASSED, $FAILED;
    if ($cond) {
        $PASSED++;
    } else {
        $FAILED++;
        echo "FAIL $name" . ($detail !== '' ? ": $detail" : '') . "\n";
    }
    return $cond;
}

function eq(string $name, $got, $want): bool
{
    return ok($name, $got === $want, 'got ' . var_export($got, true) . ', want ' . var_export($want, true));
}

function raises(string $name, string $class, callable $fn): bool
{
    try {
        $got = $fn();
    } catch (\Throwable $e) {
        return ok($name, $e instanceof $class, 'raised ' . get_class($e) . ': ' . $e->getMessage() . ", want $class");
    }
    return ok($name, false, 'returned ' . var_export($got, true) . ", want $class");
}

function summary_and_exit(): void
{
    global $PASSED, $FAILED, $SKIPPED;
    echo "pheanstalk: $PASSED passed, $FAILED failed" . ($SKIPPED ? ", $SKIPPED skipped" : '') . "\n";
    exit($FAILED === 0 ? 0 : 1);
}

function job_pair(?Job $job): array
{
    return $job === null ? [null, null] : [$job->getId(), $job->getData()];
}

function run(int $port): void
{
    global $SKIPPED;
    $tube = sprintf('ci-ph-%d-%d', getmypid(), ((int) (microtime(true) * 1000)) % 100000);
    $producer = Pheanstalk::create('127.0.0.1', $port, 5);
    $worker = Pheanstalk::create('127.0.0.1', $port, 5);
    $producer->useTube($tube);
    $worker->watchOnly($tube);

    // use / watch, asking the server rather than pheanstalk's own cache
    eq('producer using', $producer->listTubeUsed(true), $tube);
    eq('worker watching', $worker->listTubesWatched(true), [$tube]);
    ok('tube listed', in_array($tube, $producer->listTubes(), true));

    // puts: priorities, a FIFO tie, one delayed job (least urgent so that it
    // cannot jump the queue even on a slow machine)
    $tPut = microtime(true);
    $ids = [];
    foreach ([['low', 500, 0], ['high', 10, 0], ['mid', 100, 0], ['mid2', 100, 0], ['later', 100000, 1]] as [$name, $pri, $delay]) {
        $ids[$name] = $producer->put($name, $pri, $delay)->getId();
    }
    $sorted = array_values($ids);
    sort($sorted);
    ok('put ids are distinct and increasing', array_values($ids) === $sorted && count(array_unique($sorted)) === 5);

    // These hold only while the delayed job is still delayed: they are kept
    // if the block ran within 0.9 s of the put, else counted as skipped.
    $early = [];
    $soon = function (string $name, $got, $want) use (&$early) {
        $early[] = [$name, $got === $want, 'got ' . var_export($got, true) . ', want ' . var_export($want, true)];
    };

    $st = $producer->statsTube($tube);
    eq('stats-tube name', $st['name'], $tube);
    $soon('stats-tube ready', (int) $st['current-jobs-ready'], 4);
    $soon('stats-tube delayed', (int) $st['current-jobs-delayed'], 1);
    $soon('stats-tube urgent', (int) $st['current-jobs-urgent'], 4);
    eq('stats-tube total-jobs', (int) $st['total-jobs'], 5);
    eq('stats-tube using', (int) $st['current-using'], 1);
    eq('stats-tube watching', (int) $st['current-watching'], 1);

    $sj = $producer->statsJob(new JobId($ids['later']));
    $soon('stats-job delayed state', $sj['state'], 'delayed');
    eq('stats-job delayed delay', (int) $sj['delay'], 1);
    eq('stats-job delayed pri', (int) $sj['pri'], 100000);
    eq('stats-job delayed tube', $sj['tube'], $tube);
    $soon('stats-job delayed time-left in 0..1', in_array((int) $sj['time-left'], [0, 1], true), true);

    $soon('peek-delayed', job_pair($producer->peekDelayed()), [$ids['later'], 'later']);
    eq('peek-ready', job_pair($producer->peekReady()), [$ids['high'], 'high']);
    eq('peek-buried when none', $producer->peekBuried(), null);
    if (microtime(true) - $tPut < 0.9) {
        foreach ($early as [$name, $cond, $detail]) {
            ok($name, $cond, $detail);
        }
    } else {
        $SKIPPED += count($early);
        echo 'note: ' . count($early) . " delayed-state checks skipped (slow machine)\n";
    }

    // worker takes jobs in priority order, FIFO within a priority
    $got = [];
    foreach (['high', 'mid', 'mid2', 'low'] as $name) {
        $job = $worker->reserveWithTimeout(0);
        eq("reserve order $name", job_pair($job), [$ids[$name], $name]);
        $got[$name] = $job;
    }

    $sj = $worker->statsJob($got['high']);
    eq('stats-job reserved state', $sj['state'], 'reserved');
    eq('stats-job reserved reserves', (int) $sj['reserves'], 1);
    eq('stats-job ttr', (int) $sj['ttr'], Pheanstalk::DEFAULT_TTR);
    $left = (int) $sj['time-left'];
    ok('stats-job reserved time-left', $left >= 55 && $left <= 60, (string) $left);
    eq('stats-tube reserved', (int) $producer->statsTube($tube)['current-jobs-reserved'], 4);
    if (microtime(true) - $tPut < 0.8) {
        eq('delayed job not ready early', $worker->reserveWithTimeout(0), null);
    }

    // release with a new priority, reserve it again
    $worker->release($got['mid'], 5, 0);
    $sj = $worker->statsJob($got['mid']);
    eq('released job ready', [$sj['state'], (int) $sj['pri'], (int) $sj['releases']], ['ready', 5, 1]);
    $job = $worker->reserveWithTimeout(0);
    eq('reserve released job', job_pair($job), [$ids['mid'], 'mid']);
    eq('reserves counted', (int) $worker->statsJob($job)['reserves'], 2);
    $got['mid'] = $job;

    // bury / peek-buried / kick
    $worker->bury($got['low'], 7);
    $sj = $worker->statsJob($got['low']);
    eq('buried job', [$sj['state'], (int) $sj['pri'], (int) $sj['buries']], ['buried', 7, 1]);
    eq('peek-buried', job_pair($producer->peekBuried()), [$ids['low'], 'low']);
    eq('stats-tube buried', (int) $producer->statsTube($tube)['current-jobs-buried'], 1);
    eq('kick 10 -> buried only', $producer->kick(10), 1);
    $sj = $worker->statsJob($got['low']);
    eq('kicked job', [$sj['state'], (int) $sj['kicks']], ['ready', 1]);
    $job = $worker->reserveWithTimeout(0);
    eq('reserve kicked job', job_pair($job), [$ids['low'], 'low']);
    $got['low'] = $job;

    // bury / kick-job
    $worker->bury($got['mid2']);
    $producer->kickJob(new JobId($ids['mid2']));
    eq('kick-job makes job ready', $worker->statsJob(new JobId($ids['mid2']))['state'], 'ready');
    raises('kick-job of a ready job', JobNotFoundException::class,
        fn () => $producer->kickJob(new JobId($ids['mid2'])));
    $job = $worker->reserveWithTimeout(0);
    eq("reserve kick-job'd job", job_pair($job), [$ids['mid2'], 'mid2']);
    $got['mid2'] = $job;

    // touch
    $worker->touch($got['high']);
    $left = (int) $worker->statsJob($got['high'])['time-left'];
    ok('touch keeps time-left near ttr', $left >= 55 && $left <= 60, (string) $left);
    raises('delete by another connection', JobNotFoundException::class,
        fn () => $producer->delete($got['high']));

    // the delayed job arrives after ~1 s
    $job = $worker->reserveWithTimeout(5);
    $waited = microtime(true) - $tPut;
    eq('delayed job', job_pair($job), [$ids['later'], 'later']);
    ok('delayed job not before its delay', $waited >= 0.9, sprintf('after %.3fs', $waited));
    $got['later'] = $job;

    // delete everything
    foreach ($got as $name => $job) {
        $worker->delete($job);
        ok("deleted $name", true);
    }
    raises('delete twice', JobNotFoundException::class,
        fn () => $worker->delete(new JobId($ids['high'])));
    raises('peek deleted', JobNotFoundException::class,
        fn () => $producer->peek(new JobId($ids['high'])));
    eq('reserve on empty tube', $worker->reserveWithTimeout(0), null);
    $st = $producer->statsTube($tube);
    eq('stats-tube empty', [
        (int) $st['current-jobs-ready'], (int) $st['current-jobs-reserved'],
        (int) $st['current-jobs-delayed'], (int) $st['current-jobs-buried'],
    ], [0, 0, 0, 0]);
    eq('stats-tube cmd-delete', (int) $st['cmd-delete'], 5);

    // TTR and DEADLINE_SOON (ttr 1: the safety margin starts at once)
    $id = $producer->put('ttr', 1024, 0, 1)->getId();
    $job = $worker->reserveWithTimeout(0);
    eq('reserve ttr job', $job === null ? null : $job->getId(), $id);
    raises('deadline soon', DeadlineSoonException::class, fn () => $worker->reserveWithTimeout(2));
    try {
        $worker->release($job);
    } catch (JobNotFoundException $e) {
        // only on a stalled machine: the 1 s TTR ran out, the job is ready again
    }
    $worker->delete(new JobId($id));

    // pause-tube
    $producer->pauseTube($tube, 60);
    eq('stats-tube pause', (int) $producer->statsTube($tube)['pause'], 60);
    $producer->put('paused');
    eq('no reserve from a paused tube', $worker->reserveWithTimeout(0), null);
    $producer->resumeTube($tube);
    $job = $worker->reserveWithTimeout(0);
    eq('reserve after unpause', $job === null ? null : $job->getData(), 'paused');
    if ($job !== null) {
        $worker->delete($job);
    }

    // watch / ignore
    $worker->watch('default');
    eq('watch default', $worker->listTubesWatched(true), [$tube, 'default']);
    $worker->ignore('default');
    eq('ignore default', $worker->listTubesWatched(true), [$tube]);
    raises('ignore the last tube', ServerException::class, fn () => $worker->ignore($tube));
    raises('stats-tube of a missing tube', ServerException::class,
        fn () => $producer->statsTube($tube . '-missing'));

    $s = $producer->stats();
    foreach (['current-jobs-ready', 'cmd-put', 'cmd-reserve-with-timeout', 'current-connections',
              'total-jobs', 'max-job-size', 'version', 'draining'] as $key) {
        ok("stats has $key", isset($s[$key]));
    }
}

// One command no stock client sends; its first reply line.
function raw(int $port, string $lines): string
{
    $s = fsockopen('127.0.0.1', $port);
    fwrite($s, $lines);
    $reply = trim((string) fgets($s));
    fclose($s);
    return $reply;
}

// delayq's job options, seen through the stock client: a dead letter that
// release buries (pheanstalk reports that reply as beanstalkd's
// out-of-memory bury), stats with extra keys, an expiry counted in
// stats-tube. Set up with raw lines, worked with pheanstalk.
function extensions(int $port): void
{
    $tube = 'ci-ph-ext-' . getmypid();
    eq('tube-set', raw($port, "tube-set $tube tries=2 backoff=1ms\r\n"), 'SET');
    $producer = Pheanstalk::create('127.0.0.1', $port);
    $worker = Pheanstalk::create('127.0.0.1', $port);
    $producer->useTube($tube);
    $worker->watch($tube);
    $worker->ignore('default');
    $id = $producer->put('flaky', 1024, 0, 60)->getId();
    $worker->release($worker->reserveWithTimeout(5));
    $job = $worker->reserveWithTimeout(5);
    eq('second try', $job === null ? null : $job->getId(), $id);
    raises('release after the last try buries', ServerException::class,
        fn () => $worker->release($job));
    $sj = $producer->statsJob(new JobId($id));
    eq('dead letter', [$sj['state'], $sj['buried-because'], (int) $sj['tries'], (int) $sj['max-tries']],
        ['buried', 'tries', 2, 2]);
    eq("stats-job keeps beanstalkd's keys", [(int) $sj['id'], $sj['tube'], (int) $sj['reserves']],
        [$id, $tube, 2]);
    $buried = $producer->peekBuried();
    eq('peek-buried', $buried === null ? null : $buried->getId(), $id);
    $producer->kickJob(new JobId($id));
    eq('a kick starts a fresh round', (int) $producer->statsJob(new JobId($id))['tries'], 0);
    $producer->delete(new JobId($id));
    eq('put with ttl', raw($port, "use $tube\r\nput 0 0 60 11 ttl=200ms\r\nshort-lived\r\n"), "USING $tube");
    usleep(500000);
    $st = $producer->statsTube($tube);
    eq('expired and counted', [(int) $st['current-jobs-ready'], (int) $st['total-jobs-expired']], [0, 1]);
    ok('stats counts expiries', (int) $producer->stats()['total-jobs-expired'] >= 1);
}

$args = array_slice($argv, 1);
$withExtensions = in_array('--extensions', $args, true);
$args = array_values(array_diff($args, ['--extensions']));
if (count($args) !== 1 || !ctype_digit($args[0])) {
    fwrite(STDERR, "usage: php {$argv[0]} PORT [--extensions]\n");
    exit(2);
}
if (function_exists('pcntl_alarm')) {
    pcntl_async_signals(true);
    pcntl_signal(SIGALRM, function () {
        global $FAILED;
        $FAILED++;
        echo "FAIL timeout: the check did not finish within 30 s (server hung?)\n";
        summary_and_exit();
    });
    pcntl_alarm(30);
}
try {
    run((int) $args[0]);
    if ($withExtensions) {
        extensions((int) $args[0]);
    }
} catch (\Throwable $e) {
    $FAILED++;
    echo 'FAIL unexpected ' . get_class($e) . ': ' . $e->getMessage() . "\n";
}
summary_and_exit();
