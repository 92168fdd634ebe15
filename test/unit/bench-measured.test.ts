// The bench's check that a measurement measured what it says (bench/measured.ts): the relay's
// timed window holds every event sent; the Debezium peer's starts at its first message, so what
// must be complete there is what it read back (issue 28: the check counted the window and failed
// every full --peer debezium run).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { notMeasured } from '../../bench/measured.ts';

describe('the bench check that every event was measured', () => {
  it('a peer timed from its first message passes when every event was read back', () => {
    // the figures of the failing fresh-clone run in issue 28
    const run = { name: 'Debezium, backlog', events: 49_866, perSec: 30_000, readBack: 50_000 };
    assert.equal(notMeasured(run, 50_000), undefined);
  });

  it('a peer that read back fewer events than were sent fails, naming the count', () => {
    const run = { name: 'Debezium, backlog', events: 49_866, perSec: 30_000, readBack: 49_999 };
    assert.equal(notMeasured(run, 50_000), 'Debezium, backlog: 49999 events of 50000 read back');
  });

  it('a peer whose window timed no event, or more than were sent, fails', () => {
    const none = notMeasured({ name: 'p', events: 0, perSec: 1, readBack: 3000 }, 3000);
    assert.match(none ?? '', /0 events timed of 3000 sent/);
    assert.match(notMeasured({ name: 'p', events: 3001, perSec: 1, readBack: 3000 }, 3000) ?? '', /3001 events timed/);
  });

  it('the relay passes only with every event in its window', () => {
    assert.equal(notMeasured({ name: 'relay', events: 50_000, perSec: 20_000 }, 50_000), undefined);
    const short = notMeasured({ name: 'relay', events: 49_866, perSec: 20_000 }, 50_000);
    assert.equal(short, 'relay: 49866 events of 50000 measured');
  });

  it('a rate that is missing, zero or not a number fails, for either', () => {
    for (const perSec of [0, Number.NaN, Number.POSITIVE_INFINITY]) {
      assert.ok(notMeasured({ name: 'relay', events: 50_000, perSec }, 50_000));
      assert.ok(notMeasured({ name: 'peer', events: 40_000, perSec, readBack: 50_000 }, 50_000));
    }
  });
});
