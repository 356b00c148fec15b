// Mosaic's Pi extension. The supervisor installs it into each generation's private agent
// directory (<agent>/extensions/), where Pi discovers it. It forwards Pi's own lifecycle
// events to the generation's supervisor through `mosaic lane hook pi <event>` over the
// generation's lane socket, and puts the contract the supervisor hands back into the
// system prompt of every run. It holds no key and decides nothing: the supervisor checks
// every event (the process's cgroup, the conversation id) and the coordinator decides.
import { execFile } from "node:child_process";

const MOSAIC = process.env.MOSAIC_BIN;

// Events reach the supervisor in the order Pi emitted them (a run's start before its
// end), whatever order their handlers finish in: one forward after the other.
let queue = Promise.resolve();
function forward(event, payload) {
  const done = queue.then(() => forwardNow(event, payload));
  queue = done.catch(() => {});
  return done;
}

// One event to the supervisor; resolves to what it answered on stdout ("" on refusal).
function forwardNow(event, payload) {
  return new Promise((resolve) => {
    if (!MOSAIC) return resolve("");
    const child = execFile(
      MOSAIC,
      ["lane", "hook", "pi", event],
      { timeout: 120000, maxBuffer: 4 * 1024 * 1024 },
      (err, stdout) => resolve(err ? "" : stdout),
    );
    // Never the pane's terminal: the event goes in on a pipe and the pipe is closed.
    child.stdin.end(JSON.stringify(payload));
  });
}

// Waits for the supervisor's next continuation (no time limit; not settled while a run
// goes on); resolves to its text, or "" when the generation ended or the supervisor
// refused.
let waiter = null;
function awaitContinuation(sessionId) {
  return new Promise((resolve) => {
    if (!MOSAIC) return resolve("");
    const child = (waiter = execFile(
      MOSAIC,
      ["lane", "hook", "pi", "next"],
      { maxBuffer: 4 * 1024 * 1024 },
      (err, stdout) => {
        if (waiter === child) waiter = null;
        resolve(err ? "" : stdout.replace(/\n$/, ""));
      },
    ));
    child.stdin.end(JSON.stringify({ session_id: sessionId }));
  });
}

function textOf(message) {
  if (!message || message.role !== "assistant") return undefined;
  if (typeof message.content === "string") return message.content;
  return (message.content || [])
    .filter((c) => c && c.type === "text")
    .map((c) => c.text)
    .join("\n");
}

export default function (pi) {
  let contract = "";
  let lastAnswer;
  let waiting = false;

  // Settled: ask for the next continuation, without holding Pi (its event handlers are
  // awaited). One wait at a time; a continuation is submitted as a user message once —
  // the supervisor never gives the same one twice.
  function waitForContinuation(sessionId) {
    if (waiting) return;
    waiting = true;
    awaitContinuation(sessionId).then((text) => {
      waiting = false;
      if (text) pi.sendUserMessage(text, { deliverAs: "followUp" });
    });
  }

  // At startup the contract; after a /reload (this module imported again, the same
  // conversation) the same contract again, and the wait for the next continuation resumes
  // (the supervisor answers it only for an active generation).
  pi.on("session_start", async (event, ctx) => {
    const sessionId = ctx.sessionManager.getSessionId();
    const out = await forward("session-start", {
      session_id: sessionId,
      reason: event.reason,
    });
    contract = out.replace(/\n$/, "");
    if (event.reason === "reload") waitForContinuation(sessionId);
  });

  // A generation has one conversation: /new and /resume (a switch), /fork and /clone (a
  // fork) would replace it under the live generation. Refused, and reported (advisory).
  pi.on("session_before_switch", async (event, ctx) => {
    await forward("session-before-switch", {
      session_id: ctx.sessionManager.getSessionId(),
      reason: event.reason,
    });
    return { cancel: true };
  });
  pi.on("session_before_fork", async (event, ctx) => {
    await forward("session-before-fork", {
      session_id: ctx.sessionManager.getSessionId(),
      position: event.position,
    });
    return { cancel: true };
  });

  pi.on("before_agent_start", async (event) => {
    if (!contract) return undefined;
    return { systemPrompt: event.systemPrompt + "\n\n" + contract };
  });

  // A run started: tells the supervisor its typed line was taken.
  pi.on("agent_start", async (_event, ctx) => {
    await forward("agent-start", { session_id: ctx.sessionManager.getSessionId() });
  });

  pi.on("agent_end", async (event) => {
    const msgs = event.messages || [];
    for (let i = msgs.length - 1; i >= 0; i--) {
      const t = textOf(msgs[i]);
      if (t !== undefined) {
        lastAnswer = t;
        break;
      }
    }
  });

  // The settled boundary: Pi will not continue on its own (no retry, compaction or queued
  // follow-up left). agent_end is not: more may follow it.
  pi.on("agent_settled", async (event, ctx) => {
    const answer = lastAnswer;
    lastAnswer = undefined;
    const sessionId = ctx.sessionManager.getSessionId();
    await forward("agent-settled", {
      session_id: sessionId,
      aborted: !!event.aborted,
      last_assistant_message: answer ?? null,
    });
    waitForContinuation(sessionId);
  });

  // An extension's dialog (an operator's permission gate, say) waits for a human: the
  // supervisor reports the work waiting for input once the dialog has stayed open 6 s (as
  // Claude Code does), so a dialog that closes itself (a timeout, an answer at once) is not
  // reported. Its end is not reported: whoever answers it unblocks the work.
  let promptTimer = null;
  pi.on("ui_prompt_start", async (event, ctx) => {
    const payload = {
      session_id: ctx.sessionManager.getSessionId(),
      kind: event.kind,
      title: String(event.title || "").slice(0, 2000),
    };
    if (promptTimer) clearTimeout(promptTimer);
    promptTimer = setTimeout(() => {
      promptTimer = null;
      forward("ui-prompt", payload);
    }, 6000);
  });
  pi.on("ui_prompt_end", async () => {
    if (promptTimer) clearTimeout(promptTimer);
    promptTimer = null;
  });

  pi.on("session_shutdown", async (event, ctx) => {
    // This instance is going (a reload imports a new one): its wait ends with it, so a
    // continuation is never handed to an instance that can no longer submit it.
    if (waiter) waiter.kill();
    await forward("session-shutdown", {
      session_id: ctx.sessionManager.getSessionId(),
      reason: event.reason,
    });
  });
}
