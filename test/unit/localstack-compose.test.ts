// localstack/docker-compose.yml must offer the same services on the same ports as
// scripts/services.sh (5432, 9092, 4566), LocalStack and moto as alternative profiles, and init
// scripts that exist and agree with the no-Docker setup.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { accessSync, constants, existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parse } from 'yaml';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const DIR = join(ROOT, 'localstack');

interface Service {
  image?: string;
  profiles?: string[];
  ports?: string[];
  command?: string[];
  entrypoint?: string[];
  environment?: Record<string, string | number>;
  volumes?: string[];
  network_mode?: string;
}
const compose = parse(readFileSync(join(DIR, 'docker-compose.yml'), 'utf8')) as { services: Record<string, Service> };
const svc = (name: string): Service => {
  const s = compose.services[name];
  assert.ok(s, `service ${name} is missing`);
  return s;
};

/** "127.0.0.1:5432:5432" → { host: 5432, container: 5432 } */
function published(s: Service): { host: number; container: number }[] {
  return (s.ports ?? []).map((p) => {
    const parts = String(p).split(':');
    return { host: Number(parts.at(-2)), container: Number(parts.at(-1)) };
  });
}

test('postgres, kafka and both AWS emulators publish the same ports as services.sh, on loopback only', () => {
  assert.deepEqual(published(svc('postgres')).map((p) => p.host), [5432]);
  assert.deepEqual(published(svc('kafka')).map((p) => p.host), [9092]);
  assert.deepEqual(published(svc('localstack')), [{ host: 4566, container: 4566 }]);
  assert.deepEqual(published(svc('moto')), [{ host: 4566, container: 4566 }]);
  for (const [name, s] of Object.entries(compose.services)) {
    for (const p of s.ports ?? []) assert.match(String(p), /^127\.0\.0\.1:/, `${name} publishes ${p} beyond loopback`);
  }
});

test('LocalStack and moto are alternative profiles; postgres and kafka always run', () => {
  assert.deepEqual(svc('localstack').profiles, ['localstack']);
  assert.match(svc('localstack').image ?? '', /^localstack\/localstack(-pro)?(:|$)/);
  assert.ok('LOCALSTACK_AUTH_TOKEN' in (svc('localstack').environment ?? {}), 'LocalStack needs LOCALSTACK_AUTH_TOKEN');
  assert.deepEqual(svc('moto').profiles, ['moto']);
  assert.match(svc('moto').image ?? '', /^motoserver\/moto(:|$)/);
  assert.ok(svc('moto').entrypoint?.includes('4566'), 'moto must listen on 4566 (its image defaults to 5000)');
  assert.equal(svc('postgres').profiles, undefined);
  assert.equal(svc('kafka').profiles, undefined);
});

test('postgres: wal_level=logical and the outbox role/database', () => {
  const pg = svc('postgres');
  assert.match(pg.image ?? '', /^postgres:15/);
  assert.ok(pg.command?.join(' ').includes('wal_level=logical'));
  const sql = readFileSync(join(DIR, 'init', 'postgres', '01-outbox.sql'), 'utf8');
  assert.match(sql, /CREATE ROLE outbox LOGIN[^;]*PASSWORD 'outbox'/);
  assert.match(sql, /CREATE DATABASE outbox OWNER outbox/);
  assert.ok(pg.volumes?.some((v) => v.startsWith('./init/postgres:/docker-entrypoint-initdb.d')));
});

test('kafka: single KRaft node, auto-create off, same version as the no-Docker broker', () => {
  const env = svc('kafka').environment ?? {};
  assert.equal(String(env.KAFKA_AUTO_CREATE_TOPICS_ENABLE), 'false');
  assert.equal(env.KAFKA_PROCESS_ROLES, 'broker,controller');
  assert.equal(env.KAFKA_ADVERTISED_LISTENERS, 'PLAINTEXT://127.0.0.1:9092');
  const pom = readFileSync(join(ROOT, 'scripts', 'kafka', 'pom.xml'), 'utf8');
  const version = /<kafka\.version>([^<]+)<\/kafka\.version>/.exec(pom)?.[1];
  assert.equal(svc('kafka').image, `apache/kafka:${version}`);
  assert.equal(svc('kafka-init').network_mode, 'service:kafka');
});

test('init scripts exist, are executable, and create the same secrets and topic as services.sh', () => {
  const secrets = join(DIR, 'init', 'ready.d', '10-outbox-secrets.sh');
  const topics = join(DIR, 'init', 'kafka-topics.sh');
  for (const f of [secrets, topics]) {
    assert.ok(existsSync(f), `${f} is missing`);
    accessSync(f, constants.X_OK); // LocalStack runs only executable hooks
    assert.match(readFileSync(f, 'utf8'), /^#!\/bin\/sh\n/);
  }
  assert.ok(svc('localstack').volumes?.some((v) => v.startsWith('./init/ready.d:/etc/localstack/init/ready.d')));

  const sh = readFileSync(secrets, 'utf8');
  const seed = readFileSync(join(ROOT, 'scripts', 'services', 'moto-seed.py'), 'utf8');
  for (const name of ['outbox/database', 'outbox/kafka']) {
    assert.ok(sh.includes(`create ${name} `), `${secrets} does not create ${name}`);
    assert.ok(seed.includes(`"${name}"`), `moto-seed.py does not create ${name}`);
  }
  const db = JSON.parse(/create outbox\/database '([^']+)'/.exec(sh)?.[1] ?? '{}') as Record<string, unknown>;
  assert.deepEqual(db, { engine: 'postgres', username: 'outbox', password: 'outbox', host: '127.0.0.1', port: 5432, dbname: 'outbox' });
  assert.match(readFileSync(topics, 'utf8'), /--topic outbox\.event\.order\b/);
  assert.match(readFileSync(join(ROOT, 'scripts', 'services', 'kafka.sh'), 'utf8'), /outbox\.event\.order:3/);
});

test('versions: the same Postgres major, Kafka and moto as the no-Docker services; what Docker does not offer is listed', () => {
  const pgMajor = /^PG_MAJOR=(\d+)$/m.exec(readFileSync(join(ROOT, 'scripts', 'services', 'postgres.sh'), 'utf8'))?.[1];
  assert.equal(svc('postgres').image, `postgres:${pgMajor}`);
  const motoVersion = /^MOTO_SPEC="moto\[server\]==([^"]+)"$/m.exec(readFileSync(join(ROOT, 'scripts', 'services', 'moto.sh'), 'utf8'))?.[1];
  assert.ok(motoVersion, 'MOTO_SPEC in scripts/services/moto.sh');
  assert.equal(svc('moto').image, `motoserver/moto:${motoVersion}`);
  // PgBouncer (6432) exists only without Docker; the README says so, and which tests need it
  assert.ok(!Object.values(compose.services).some((s) => published(s).some((p) => p.host === 6432)), 'a compose pooler on 6432: update localstack/README.md');
  const readme = readFileSync(join(DIR, 'README.md'), 'utf8');
  assert.match(readme, /PgBouncer/);
  assert.match(readme, /not been run/);
});
