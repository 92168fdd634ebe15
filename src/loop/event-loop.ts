// postgres.js defers socket writes under 1 KB to a setImmediate (it coalesces small messages),
// and kafkajs encodes a whole batch synchronously before it writes anything. Where the order in
// which two things reach their sockets matters, or a query should start before a long encoding,
// wait here: after two turns of the event loop, the immediates queued now have run.
export async function socketsFlushed(): Promise<void> {
  for (let i = 0; i < 2; i++) await new Promise<void>((resolve) => setImmediate(resolve));
}
