// Mosaic's OpenCode plugin. The supervisor installs it into each generation's private area
// and lists it in the generation's own config (OPENCODE_CONFIG). It forwards OpenCode's
// lifecycle to the generation's supervisor through `mosaic lane hook opencode <event>`
// over the generation's lane socket, and puts the contract the supervisor hands back into
// the system prompt of every request. It holds no key and decides nothing: the supervisor
// checks every event (the process's cgroup, the conversation id) and the coordinator
// decides.
import { spawn } from "node:child_process";

const MOSAIC = process.env.MOSAIC_BIN;

// One event to the supervisor; resolves to what it answered on stdout ("" on refusal).
// stdin is a pipe we close and stderr is dropped: a child must never read the pane's
// terminal, or it would hang the TUI.
function forward(event, payload) {
  return new Promise((resolve) => {
    if (!MOSAIC) return resolve("");
    let out = "";
    const child = spawn(MOSAIC, ["lane", "hook", "opencode", event], {
      stdio: ["pipe", "pipe", "ignore"],
    });
    child.stdout.on("data", (d) => (out += d));
    child.on("error", () => resolve(""));
    child.on("close", (code) => resolve(code === 0 ? out : ""));
    child.stdin.end(JSON.stringify(payload));
  });
}

// Waits for the supervisor's next continuation (no time limit; not settled while a turn
// runs); resolves to its text, or "" when the generation ended or the supervisor refused.
function awaitContinuation(sessionId) {
  return forward("next", { session_id: sessionId }).then((out) => out.replace(/\n$/, ""));
}

// Events reach the supervisor in the order OpenCode emitted them (a turn's start before
// its end), whatever order its handlers finish in: one forward after the other.
let queue = Promise.resolve();
function inOrder(work) {
  const done = queue.then(work);
  queue = done.catch(() => {});
  return done;
}

// Each subagent's session, to the session it was started from: a prompt a subagent shows
// waits on the same human as the conversation's own.
const parents = new Map();
function rootOf(sessionID) {
  let id = sessionID;
  for (let i = 0; i < 64 && parents.has(id); i++) id = parents.get(id);
  return id;
}

export const MosaicPlugin = async ({ client }) => {
  let waiting = false;

  // Settled: ask for the next continuation without holding OpenCode's event loop, and
  // submit it to the session as a user prompt — once: the supervisor never gives the same
  // one twice.
  function waitForContinuation(sessionID) {
    if (waiting) return;
    waiting = true;
    awaitContinuation(sessionID).then(async (text) => {
      waiting = false;
      if (!text) return;
      try {
        await client.session.promptAsync({
          path: { id: sessionID },
          body: { parts: [{ type: "text", text }] },
        });
      } catch (_) {}
    });
  }

  // The contract, fetched once when the plugin loads (the session's start).
  const contract = (await forward("session-start", { reason: "startup" })).replace(/\n$/, "");

  async function lastAnswer(sessionID) {
    try {
      const r = await client.session.messages({ path: { id: sessionID } });
      const msgs = (r && r.data) || [];
      // The turn's own answer only: the latest message, if it is the assistant's. A turn
      // that ended without one (aborted, failed) answered nothing — never an earlier
      // turn's answer.
      const m = msgs[msgs.length - 1];
      if (m && m.info && m.info.role === "assistant") {
        const text = (m.parts || [])
          .filter((p) => p && p.type === "text")
          .map((p) => p.text)
          .join("\n");
        return text || null;
      }
    } catch (_) {}
    return null;
  }

  return {
    "experimental.chat.system.transform": async (_input, output) => {
      if (contract) output.system.push(contract);
    },
    event: async ({ event }) => {
      const p = event.properties || {};
      if (event.type === "session.idle") {
        await inOrder(async () =>
          forward("session-idle", {
            session_id: p.sessionID,
            last_assistant_message: await lastAnswer(p.sessionID),
          }),
        );
        waitForContinuation(p.sessionID);
      } else if (event.type === "session.status" && p.status && p.status.type === "busy") {
        // A turn started: tells the supervisor its typed line was taken.
        await inOrder(() => forward("session-busy", { session_id: p.sessionID }));
      } else if (event.type === "question.asked" || event.type === "permission.asked") {
        // A question or a permission ask is on screen: it waits for a human.
        const what =
          event.type === "question.asked"
            ? (p.questions || []).map((q) => q && q.question).join(" | ")
            : `${p.permission} ${(p.patterns || []).join(", ")}`;
        await inOrder(() =>
          forward("waiting-for-input", {
            session_id: rootOf(p.sessionID),
            kind: event.type,
            prompt: String(what).slice(0, 2000),
          }),
        );
      } else if (event.type === "session.created") {
        const info = p.info || {};
        if (info.id && info.parentID) parents.set(info.id, info.parentID);
        await inOrder(() =>
          forward("session-created", {
            session_id: (p.info && p.info.id) || p.sessionID,
            parent_id: (p.info && p.info.parentID) || null,
          }),
        );
      }
    },
  };
};
