// postgres.js defers writes under 1 KB to a setImmediate and kafkajs encodes a whole batch before
// it writes: after two turns of the event loop, what was queued before has reached its socket.
export async function socketsFlushed(): Promise<void> {
  for (let i = 0; i < 2; i++) await new Promise<void>((resolve) => setImmediate(resolve));
}
