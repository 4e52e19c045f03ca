// Streams the assistant's reply from the OpenAI-compatible endpoint (Server-Sent Events over
// fetch: EventSource cannot POST). Stop aborts the fetch; the server then aborts the request.
"use strict";

const API = "/api/v1/chat/completions";
const history = [];
const els = {
  messages: document.getElementById("messages"),
  form: document.getElementById("composer"),
  prompt: document.getElementById("prompt"),
  send: document.getElementById("send"),
  stop: document.getElementById("stop"),
  maxTokens: document.getElementById("max-tokens"),
  temperature: document.getElementById("temperature"),
  jsonMode: document.getElementById("json-mode"),
};
let controller = null;

function bubble(role, text) {
  const div = document.createElement("div");
  div.className = `message ${role}`;
  div.textContent = text;
  els.messages.append(div);
  els.messages.scrollTop = els.messages.scrollHeight;
  return div;
}

// Yields each SSE event's data string from a fetch response body.
async function* sseData(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (line.startsWith("data: ")) yield line.slice(6);
      }
    }
  }
}

async function ask(text) {
  history.push({ role: "user", content: text });
  bubble("user", text);
  const reply = bubble("assistant", "");
  reply.dataset.state = "streaming";
  controller = new AbortController();
  els.send.disabled = true;
  els.stop.disabled = false;
  let answer = "";
  try {
    const response = await fetch(API, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({
        messages: history,
        stream: true,
        max_tokens: Number(els.maxTokens.value) || 128,
        temperature: Number(els.temperature.value),
        // JSON mode: the engine's grammar makes every reply one JSON object.
        ...(els.jsonMode.checked ? { response_format: { type: "json_object" } } : {}),
      }),
      signal: controller.signal,
    });
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      throw new Error(body.error ? body.error.message : `HTTP ${response.status}`);
    }
    for await (const data of sseData(response)) {
      if (data === "[DONE]") break;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      const delta = chunk.choices.length ? chunk.choices[0].delta.content : "";
      if (delta) {
        answer += delta;
        reply.append(delta);  // one text node per delta: the reply grows as tokens arrive
        els.messages.scrollTop = els.messages.scrollHeight;
      }
    }
    reply.dataset.state = "done";
  } catch (err) {
    if (err.name === "AbortError") {
      reply.dataset.state = "stopped";
    } else {
      reply.classList.add("error");
      reply.append(`\n[${err.message}]`);
      reply.dataset.state = "error";
    }
  } finally {
    history.push({ role: "assistant", content: answer });
    controller = null;
    els.send.disabled = false;
    els.stop.disabled = true;
  }
}

els.form.addEventListener("submit", (e) => {
  e.preventDefault();
  const text = els.prompt.value.trim();
  if (!text || controller) return;
  els.prompt.value = "";
  ask(text);
});
els.prompt.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    els.form.requestSubmit();
  }
});
els.stop.addEventListener("click", () => controller && controller.abort());
