// tests/serve_client/test_openai_client.mjs — `shardwise serve` spoken to by the official openai npm
// client: models.list, chat.completions.create whole and streamed (the stream's pieces make the whole
// reply), completions.create, concurrent streams batched on the server's slots (each one's text as when
// it ran alone), and errors reaching the client as APIError with their status.
// usage: node test_openai_client.mjs SHARDWISE_BIN   (run.sh installs the pinned client, then runs this)
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';

const bin = process.argv[2];
assert.ok(bin, 'usage: node test_openai_client.mjs SHARDWISE_BIN');

// A small synthetic llama model with a byte vocabulary whose greedy replies depend on the whole prompt.
const dir = mkdtempSync(join(tmpdir(), 'shardwise-serve-client-'));
const spec = join(dir, 'model.yaml');
writeFileSync(spec, `name: serve_client
family: llama
dtype: f32
hidden_size: 128
num_hidden_layers: 2
num_attention_heads: 4
num_key_value_heads: 2
head_dim: 32
intermediate_size: 256
vocab_size: 384
rope_theta: 10000.0
rms_norm_eps: 1.0e-05
tie_word_embeddings: false
max_position_embeddings: 4096
`);
const model = `synthetic:${spec}?seed=1`;
const key = 'test-key';

const server = spawn(bin, ['serve', '-m', model, '--port', '0', '--api-key', key, '-c', '4096', '-np', '4'], {
  stdio: ['ignore', 'pipe', 'inherit'],
});
const exited = new Promise((resolve) => server.on('exit', (code, signal) => resolve(code ?? signal)));
const url = await new Promise((resolve, reject) => {
  let out = '';
  server.stdout.on('data', (d) => {
    out += d;
    const m = out.match(/listening on (http:\/\/\S+)/);
    if (m) resolve(m[1]);
  });
  exited.then((code) => reject(new Error(`shardwise serve exited (${code}) before printing its address`)));
  setTimeout(() => reject(new Error('shardwise serve printed no address in 60 s')), 60000).unref();
});

const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: key, maxRetries: 0, timeout: 60000 });
const version = JSON.parse(readFileSync(new URL('./node_modules/openai/package.json', import.meta.url))).version;

async function checks() {
  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), [model]);

  const request = {
    model: 'any-name',
    messages: [
      { role: 'system', content: 'Answer briefly.' },
      { role: 'user', content: 'Hello there, how are you?' },
    ],
    max_tokens: 24,
    temperature: 0,
  };
  const chat = await client.chat.completions.create(request);
  assert.equal(chat.object, 'chat.completion');
  assert.equal(chat.model, 'any-name');
  const reply = chat.choices[0];
  assert.equal(reply.message.role, 'assistant');
  assert.equal(typeof reply.message.content, 'string');
  assert.ok(['stop', 'length'].includes(reply.finish_reason), reply.finish_reason);
  assert.ok(chat.usage.completion_tokens >= 1 && chat.usage.completion_tokens <= 24);
  assert.equal(chat.usage.total_tokens, chat.usage.prompt_tokens + chat.usage.completion_tokens);
  if (reply.finish_reason === 'length') assert.equal(chat.usage.completion_tokens, 24);

  const stream = await client.chat.completions.create({ ...request, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.delta?.content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(text, reply.message.content);  // greedy: the stream's pieces make the whole reply
  assert.equal(finish, reply.finish_reason);
  assert.deepEqual(usage.completion_tokens, chat.usage.completion_tokens);

  // llama-server's ignore_eos passes through as an extra field: every token asked for comes.
  const completion = await client.completions.create({
    model: 'm', prompt: 'The quick brown fox', max_tokens: 8, temperature: 0, ignore_eos: true,
  });
  assert.equal(completion.object, 'text_completion');
  assert.equal(typeof completion.choices[0].text, 'string');
  assert.equal(completion.usage.completion_tokens, 8);
  assert.equal(completion.choices[0].finish_reason, 'length');

  // Four users at once, batched on the server's four slots: each one's streamed text is the text its
  // request gets alone (greedy), whatever the others do meanwhile.
  const asks = ['One', 'Two users at once', 'Three: a longer prompt than the others by far, to read in chunks', 'Four']
    .map((content, i) => ({ model: 'm', messages: [{ role: 'user', content }], max_tokens: 12 + 4 * i, temperature: 0 }));
  const alone = [];
  for (const a of asks) alone.push((await client.chat.completions.create(a)).choices[0].message.content);
  const together = await Promise.all(asks.map(async (a) => {
    let t = '';
    for await (const chunk of await client.chat.completions.create({ ...a, stream: true }))
      for (const c of chunk.choices) t += c.delta?.content ?? '';
    return t;
  }));
  assert.deepEqual(together, alone);

  await assert.rejects(client.chat.completions.create({ model: 'm', messages: [] }),
    (e) => e instanceof OpenAI.APIError && e.status === 400 && e.code === 'invalid_value');
  const intruder = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(intruder.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
}

try {
  await checks();
} finally {
  server.kill('SIGTERM');
}
assert.equal(await exited, 0, 'shardwise serve exits 0 on SIGTERM');
console.log(`serve_client: ok (openai ${version} against ${url})`);
