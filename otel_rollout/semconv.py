"""Names otel_rollout emits that the OpenTelemetry semantic conventions do not (yet) define.

GenAI and error names come from ``opentelemetry.semconv`` wherever a constant exists; this module
holds our own ``rollout.*`` names, each once, so a dashboard or a rule can be checked against
one list. Where a step-span attribute and a step metric mean the same figure they share one name.
It also holds the few GenAI names newer than the ``opentelemetry-semantic-conventions`` package
(the ``gen_ai_latest_experimental`` opt-in's), until that package has constants for them.
"""

from __future__ import annotations

# --- spans ---------------------------------------------------------------------------------
STEP_SPAN_NAME = "rollout.step"
BATCH_SPAN_NAME = "rollout.batch"
EVENT_FIRST_TOKEN = "gen_ai.first_token"
"""Span event at the engine's first output token; its timestamp is the engine's, not ours."""

# --- request attributes (spans; the finish reason also on metrics) --------------------------
ROLLOUT_STEP = "rollout.step"
"""The training step a request belongs to; also the baggage key that carries it across processes."""
ROLLOUT_FINISH_REASON = "rollout.finish_reason"
"""One normalised finish reason per request on metrics (bounded: stop, length, abort, error)."""
ROLLOUT_QUEUE_TIME = "rollout.request.queue_time"
"""Queue time on the request span; also the name of the queue-time histogram."""
ROLLOUT_TTFT = "rollout.request.time_to_first_token"
ROLLOUT_CACHED_TOKENS = "rollout.usage.cached_tokens"
ROLLOUT_PREEMPTIONS = "rollout.request.preemptions"
"""Times the engine preempted the request (KV cache full: evicted, later recomputed), as the
engine counted them; absent where the engine does not report it."""
ROLLOUT_SPEC_DRAFT_TOKENS = "rollout.request.spec_decode.draft_tokens"
"""Draft tokens speculative decoding proposed for the request (the engine's own count; absent
where the engine does not report it per request: vLLM with ``per_request_spec_decode_metrics``)."""
ROLLOUT_SPEC_ACCEPTED_TOKENS = "rollout.request.spec_decode.accepted_tokens"
"""Of those, the draft tokens the target model accepted."""
STEP_ATTR_PREEMPTIONS = "rollout.step.preemptions"
"""Σ of the step's requests' preemptions (only requests whose engine reports them)."""
ROLLOUT_SAMPLING_REASON = "rollout.sampling.reason"
"""Why a sampled step kept this request span (:mod:`otel_rollout.sampling`): ``error``,
``truncated``, ``tail``, ``rate`` or ``slowest``; absent where every span is kept."""
ROLLOUT_TIMING_SOURCE = "rollout.timing.source"
"""Where the span's timestamps came from: ``engine``, ``engine_steps``, ``engine_latency``, ``observed`` (docs/ENGINES.md)."""
ROLLOUT_BATCH_SIZE = "rollout.batch.size"
ROLLOUT_REPLICA = "rollout.replica"
"""The engine instance that served the request (:mod:`otel_rollout.replicas`): a Ray actor's
name, ``host:pid`` (``#k`` for a process's k-th other engine), or a client's server ``host:port``."""
ROLLOUT_WEIGHT_VERSION = "rollout.weight.version"
ROLLOUT_WEIGHT_VERSION_SOURCE = "rollout.weight.version_source"
ROLLOUT_WEIGHT_VERSIONS = "rollout.weight.versions"
ROLLOUT_WEIGHT_VERSION_TOKENS = "rollout.weight.version_tokens"
"""The engine's policy weight version when the request arrived (:mod:`otel_rollout.versions`)."""
ROLLOUT_STEP_ATTRIBUTE_PREFIX = "rollout.step."
ROLLOUT_STEP_RANK = "rollout.step.rank"
"""The rank whose step span this is, where every rank of a job opens the step (one trace)."""
ROLLOUT_STEP_RANKS = "rollout.step.ranks"
"""How many ranks open the step; each step span's figures are its own rank's."""
"""Extra keyword arguments of ``rollout_step(i, key=value)`` become ``rollout.step.key`` on the step span."""

# --- request metrics (besides the GenAI semconv ones) --------------------------------------
METRIC_ACTIVE = "rollout.requests.active"
METRIC_ENGINE_BUSY_TIME = "rollout.engine.busy_time"
METRIC_ENGINE_IDLE_TIME = "rollout.engine.idle_time"
METRIC_ENGINE_HELD_TIME = "rollout.engine.held_time"
"""Time an engine was held by an engine operation (weight sync, sleep, wake, pause), asleep or
paused: neither busy nor idle (:mod:`otel_rollout.engine_ops`)."""
METRIC_OLDEST_AGE = "rollout.requests.oldest_age"
"""Age of the engine's oldest request in flight: a straggler's age while it runs."""
METRIC_ENGINE_SILENCE = "rollout.engine.silence"
"""Seconds the engine produced no output while requests were in flight (0 when none are, or
while it is held): how a stalled rollout differs from a slow one (:mod:`otel_rollout.stalls`)."""
METRIC_ENGINE_STALLED = "rollout.engine.stalled"
"""1 while the engine's silence exceeds ``OTEL_ROLLOUT_STALL_TIMEOUT``, else 0."""
METRIC_STEP_REQUESTS_DONE = "rollout.step.open.requests_done"
"""Live progress: requests of the steps open now that finished (this process's view)."""
METRIC_STEP_REQUESTS_STARTED = "rollout.step.open.requests_started"
"""Live progress: requests of the steps open now that entered an engine of this process."""
METRIC_TELEMETRY_DROPPED = "rollout.telemetry.dropped"
"""Request records whose spans and metric points were never made (the emitter's queue was full)."""
ROLLOUT_DROP_REASON = "rollout.drop.reason"

# --- step analytics: metric names, and step-span attributes where they share the name --------
STEP_DURATION = "rollout.step.duration"
STEP_REQUESTS = "rollout.step.requests"
STEP_TAIL_DURATION = "rollout.step.tail.duration"
STEP_TAIL_REQUESTS = "rollout.step.tail.requests"
STEP_STRAGGLER_RATIO = "rollout.step.straggler_ratio"
STEP_OUTPUT_TOKENS = "rollout.step.output_tokens"
STEP_TRUNCATION_RATIO = "rollout.step.truncation_ratio"
STEP_IDLE_CAPACITY = "rollout.step.idle_capacity"
STEP_IDLE_FRACTION = "rollout.step.idle_fraction"
ROLLOUT_STATISTIC = "rollout.statistic"
"""Which per-step statistic a ``rollout.step.output_tokens`` point is: ``max``, ``p50`` or ``p90``."""

# --- step-span attributes with a unit suffix (span attributes carry no unit of their own) ---
STEP_ATTR_TAIL_DURATION = "rollout.step.tail.duration_s"
STEP_ATTR_TAIL_FRACTION = "rollout.step.tail.fraction"
STEP_ATTR_OUTPUT_TOKENS_MAX = "rollout.step.output_tokens.max"
STEP_ATTR_OUTPUT_TOKENS_P50 = "rollout.step.output_tokens.p50"
STEP_ATTR_OUTPUT_TOKENS_P90 = "rollout.step.output_tokens.p90"
STEP_ATTR_LATENCY_P50 = "rollout.step.latency.p50_s"
STEP_ATTR_LATENCY_P90 = "rollout.step.latency.p90_s"
STEP_ATTR_LATENCY_MAX = "rollout.step.latency.max_s"
STEP_ATTR_IDLE_CAPACITY = "rollout.step.idle_capacity_s"
STEP_ATTR_PEAK_ACTIVE = "rollout.step.peak_active"
STEP_PARTIAL = "rollout.step.partial"
"""True on a step some of whose remote calls never reported their requests (figures are partial)."""
STEP_MISSING_CALLS = "rollout.step.missing_calls"

# --- inside the engine: request phases and prefix cache (#12) --------------------------------
ROLLOUT_PREFILL_TIME = "rollout.request.prefill_time"
"""Scheduled → first token on the request span (seconds), where the engine stamped both."""
ROLLOUT_DECODE_TIME = "rollout.request.decode_time"
"""First token → finish on the request span (seconds)."""
EVENT_SCHEDULED = "rollout.scheduled"
"""Span event where the engine scheduled the request (the end of its queue); the engine's time."""
STEP_CACHE_HIT_RATE = "rollout.step.cache_hit_rate"
"""Prompt tokens found in the prefix cache ÷ prompt tokens, over the step's requests whose
engine reports cached tokens: a step attribute and a ``rollout.step.*`` histogram."""
STEP_ATTR_CACHED_TOKENS = "rollout.step.cached_tokens"
STEP_QUEUE_TIME = "rollout.step.queue_time"
STEP_PREFILL_TIME = "rollout.step.prefill_time"
STEP_DECODE_TIME = "rollout.step.decode_time"
"""Per-step request phases as ``rollout.step.*`` histograms: two points per step
(``rollout.statistic`` = p90 / max over its requests), the span attributes' values."""
STEP_ATTR_QUEUE_P90 = "rollout.step.queue_time.p90_s"
STEP_ATTR_QUEUE_MAX = "rollout.step.queue_time.max_s"
STEP_ATTR_PREFILL_P90 = "rollout.step.prefill_time.p90_s"
STEP_ATTR_PREFILL_MAX = "rollout.step.prefill_time.max_s"
STEP_ATTR_DECODE_P90 = "rollout.step.decode_time.p90_s"
STEP_ATTR_DECODE_MAX = "rollout.step.decode_time.max_s"

# --- the engine's own figures over a step (otel_rollout.engine_stats) -------------------------
STEP_ENGINE_KV_CACHE_USAGE = "rollout.step.engine.kv_cache_usage"
"""Per-step KV-cache usage (0-1) as the engine reported it each iteration: a histogram with
``rollout.statistic`` peak / mean, and the step attributes ``….peak`` / ``….mean``."""
STEP_ATTR_ENGINE_KV_PEAK = "rollout.step.engine.kv_cache_usage.peak"
STEP_ATTR_ENGINE_KV_MEAN = "rollout.step.engine.kv_cache_usage.mean"
STEP_ATTR_ENGINE_ITERATIONS = "rollout.step.engine.iterations"
STEP_ATTR_ENGINE_RUNNING_PEAK = "rollout.step.engine.running.peak"
STEP_ATTR_ENGINE_WAITING_PEAK = "rollout.step.engine.waiting.peak"
STEP_ATTR_ENGINE_PROMPT_TOKENS = "rollout.step.engine.prompt_tokens"
STEP_ATTR_ENGINE_GENERATION_TOKENS = "rollout.step.engine.generation_tokens"
STEP_ATTR_ENGINE_THROUGHPUT = "rollout.step.engine.generation_throughput"
STEP_ATTR_ENGINE_PREEMPTIONS = "rollout.step.engine.preemptions"
STEP_ATTR_ENGINE_PREFIX_HIT_RATE = "rollout.step.engine.prefix_cache_hit_rate"
STEP_ATTR_ENGINE_ABORTED = "rollout.step.engine.aborted"
STEP_ATTR_ENGINE_SPEC_DRAFT_TOKENS = "rollout.step.engine.spec_decode.draft_tokens"
STEP_ATTR_ENGINE_SPEC_ACCEPTED_TOKENS = "rollout.step.engine.spec_decode.accepted_tokens"
STEP_ATTR_ENGINE_SPEC_ACCEPTANCE_RATE = "rollout.step.engine.spec_decode.acceptance_rate"
"""Speculative decoding over the step (vLLM's ``SpecDecodingStats`` each iteration): draft
tokens proposed, accepted, and accepted ÷ proposed; absent where the engine drafted nothing."""
STEP_ATTR_ENGINE_SOURCE = "rollout.step.engine.source"
"""How the step's engine figures were taken: ``iterations`` (every scheduler iteration, vLLM's
stat-logger interface) or ``sampled`` (the engine's own metrics read at the step's start, each
second and its end: SGLang's scheduler; counts exact, gauges sampled)."""

# --- weight-version staleness (otel_rollout.versions) ----------------------------------------
STEP_ATTR_WEIGHT_VERSION = "rollout.step.weight_version"
STEP_STALENESS = "rollout.step.staleness"
STEP_ATTR_STALENESS_MAX = "rollout.step.staleness.max"
STEP_ATTR_STALENESS_MEAN = "rollout.step.staleness.mean"
STEP_ATTR_STALE_REQUESTS = "rollout.step.stale_requests"

# --- step phases (otel_rollout.phases) -------------------------------------------------------
PHASE_SPAN_NAME = "rollout.phase"
PHASE_NAME = "rollout.phase.name"
"""The phase's name: on its span, and the one label of ``rollout.step.phase.duration`` (bounded)."""
PHASE_FRAMEWORK = "rollout.phase.framework"
"""The framework whose own timer the phase came from (``verl``), or the engine whose own call it
is (``vllm``, ``sglang``: :mod:`otel_rollout.engine_ops`); absent for ``rollout_phase``."""
PHASE_FRAMEWORK_NAME = "rollout.phase.framework_name"
"""That framework's own name for the phase (verl's ``marked_timer`` name: ``old_log_prob``, …), or
the engine method (``AsyncLLM.sleep``, ``collective_rpc:reload_weights``)."""
STEP_PHASE_DURATION = "rollout.step.phase.duration"
STEP_ATTR_PHASE_PREFIX = "rollout.step.phase."
"""``rollout.step.phase.<name>.duration_s`` on the step span: that phase's total in the step."""
STEP_ATTR_PHASE_SUFFIX = ".duration_s"
STEP_ATTR_UNACCOUNTED = "rollout.step.unaccounted_s"
"""Step seconds no top-level phase covered (the step's duration minus its phases' totals)."""

# --- agentic trajectories (otel_rollout.trajectories) ---------------------------------------
TRAJECTORY_SAMPLE_ID = "rollout.trajectory.sample_id"
"""The sample a trajectory generates (span attribute only: never a metric label)."""
TRAJECTORY_GROUP_ID = "rollout.trajectory.group_id"
"""Its group (GRPO's prompt group), span attribute only."""
TRAJECTORY_TURNS = "rollout.trajectory.turns"
"""Engine requests (turns) of the trajectory: on its span, and the name of their histogram."""
TRAJECTORY_DURATION = "rollout.trajectory.duration"
TRAJECTORY_OUTPUT_TOKENS = "rollout.trajectory.output_tokens"
TRAJECTORY_GENERATION_S = "rollout.trajectory.generation_s"
"""Seconds some turn of the trajectory was running in an engine (the union of their intervals)."""
TRAJECTORY_TOOL_S = "rollout.trajectory.tool_s"
TRAJECTORY_TOOL_CALLS = "rollout.trajectory.tool_calls"
TRAJECTORY_SCORING_S = "rollout.trajectory.scoring_s"
TRAJECTORY_WAITING_S = "rollout.trajectory.waiting_s"
"""Trajectory seconds in no turn, tool call or scoring (queues, the loop's own code)."""
TRAJECTORY_REWARD = "rollout.trajectory.reward"
TRAJECTORY_ADVANTAGE = "rollout.trajectory.advantage"
TRAJECTORY_TURN_TIMING = "rollout.trajectory.turn_timing"
"""Whose clock timed the turns (``generation_s``): ``engine_request`` (each turn is a request
record of an instrumented engine in this process, as its span's ``rollout.timing.source`` says),
``client_call`` (the loop's client timed its call to an engine in another process: verl's Ray
call to its server actor), or ``mixed``."""
TRAJECTORY_STATUS = "rollout.trajectory.status"
"""How it ended: completed, truncated, aborted, stale_dropped, error (bounded: a metric label)."""
SCORING_SPAN_NAME = "rollout.scoring"

# --- baggage ---------------------------------------------------------------------------------
BAGGAGE_STEP_KEY = "rollout.step.key"
"""An open step's unique key, so requests in other processes can be reported back to it."""

# --- a step's trajectories (step span and step metric) ---------------------------------------
STEP_ATTR_TRAJECTORIES = "rollout.step.trajectories"
"""Trajectories that ended in the step (:mod:`otel_rollout.trajectories`)."""
STEP_ATTR_TRAJECTORY_TURNS_P50 = "rollout.step.trajectory.turns.p50"
STEP_ATTR_TRAJECTORY_TURNS_MAX = "rollout.step.trajectory.turns.max"
STEP_ATTR_TRAJECTORY_DURATION_P50 = "rollout.step.trajectory.duration.p50_s"
STEP_ATTR_TRAJECTORY_DURATION_P90 = "rollout.step.trajectory.duration.p90_s"
STEP_ATTR_TRAJECTORY_DURATION_MAX = "rollout.step.trajectory.duration.max_s"
STEP_TOOL_SHARE = "rollout.step.trajectory.tool_share"
"""Share of the step's trajectory-seconds spent in tool calls: on the step span and a metric."""
STEP_ATTR_SLOWEST_TRAJECTORIES = "rollout.step.trajectory.slowest"
"""Span ids (hex) of the step's slowest trajectories, slowest first: their spans are in the step's trace."""

# --- GenAI names of semantic-conventions-genai that opentelemetry.semconv has no constant for ---
# Emitted only with OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental, in place of
# gen_ai.client.token.usage (removed there; see its migration guide).
GEN_AI_USAGE_INPUT_TOKENS_COUNTER = "gen_ai.client.inference.usage.input_tokens"
"""Counter: input tokens spent, by ``gen_ai.token.modality``; its rate is the prompt-token rate."""
GEN_AI_USAGE_OUTPUT_TOKENS_COUNTER = "gen_ai.client.inference.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ_COUNTER = "gen_ai.client.inference.usage.cache_read.input_tokens"
"""Counter: the input tokens the engine served from its prefix cache (a subset of the input
tokens), where the engine reports them per request."""
GEN_AI_OPERATION_INPUT_TOKENS = "gen_ai.client.inference.operation.input_tokens"
"""Histogram: input tokens per request (no modality label: percentiles do not add up)."""
GEN_AI_OPERATION_OUTPUT_TOKENS = "gen_ai.client.inference.operation.output_tokens"
"""Histogram: output tokens per request, the response length."""
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"
"""Span attribute: cached prompt tokens (``rollout.usage.cached_tokens`` by default). Ours here,
not the package's constant: opentelemetry-semantic-conventions 0.58b0, the oldest we declare,
lacks it."""
GEN_AI_TOKEN_MODALITY = "gen_ai.token.modality"
"""On the usage counters: ``text`` for output tokens (the engines generate text), ``unknown``
for input tokens (a prompt's count includes a multimodal model's image tokens, and the engines
do not split it)."""

# --- the proposed rl.* conventions (OTEL_SEMCONV_STABILITY_OPT_IN=rl_latest_experimental) -----
# open-telemetry/semantic-conventions-genai issue #88 (proposal of 2026-03-26): docs/EMITS.md
# says which of its names we emit, where we differ and why (otel_rollout.rl_conventions).
RL_LOOP_SPAN_NAME = "rl.loop"
"""The outer RL iteration: our step span's name under the opt-in."""
RL_SAMPLE_SPAN_NAME = "rl.sample"
RL_REWARD_SPAN_NAME = "rl.reward"
RL_TRAIN_SPAN_NAME = "rl.train"
RL_SYNC_SPAN_NAME = "rl.sync"
RL_RUN_ID = "rl.run.id"
RL_SYSTEM = "rl.system"
RL_ALGORITHM = "rl.algorithm"
RL_MODEL_NAME = "rl.model.name"
RL_LOOP_DURATION = "rl.loop.duration"
"""Histogram (s): one point per step, under the opt-in, beside ``rollout.step.duration``."""
STEP_FRAMEWORK = "rollout.step.framework"
"""The RL framework whose hook opened the step (``verl``, ``trl``, ``openrlhf``, ``slime``)."""
STEP_ALGORITHM = "rollout.step.algorithm"
"""The framework's algorithm (its advantage estimator: ``grpo``, ``rloo``, ``gae``…), where
the hook can read it."""

# --- why the step was slow (otel_rollout.attribution) ----------------------------------------
STEP_ATTR_CAUSE_PREFIX = "rollout.step.cause."
STEP_ATTR_CAUSE_SUFFIX = "_s"
"""``rollout.step.cause.<cause>_s``: the step's seconds of each cause (``attribution.CAUSES``)."""
STEP_CAUSE_DOMINANT = "rollout.step.cause.dominant"
"""The cause with the most of the step's seconds."""
STEP_CAUSE_DURATION = "rollout.step.cause.duration"
"""Histogram (s): each cause's seconds of a step, one point per cause per step, by ``rollout.cause``."""
ROLLOUT_CAUSE = "rollout.cause"
STEP_ATTR_WHATIF_PREFIX = "rollout.step.whatif."
"""``rollout.step.whatif.<change>.<figure>``: estimates (:mod:`otel_rollout.whatif`) — ``cap_p95``
/ ``cap_p99`` (``tokens``, ``saved_s``, ``truncated``), ``stop_90`` / ``stop_95`` (``saved_s``,
``lost``), where the step had several replicas ``balanced`` (``saved_s``) and
``fewest_replicas`` (``replicas``)."""

STEP_WHATIF_SAVED = "rollout.step.whatif.saved"
"""Histogram (s): each what-if change's estimated saving, one point per change per step, by
``rollout.whatif`` (``cap_p95``, ``cap_p99``, ``stop_90``, ``stop_95``, ``balanced``)."""
ROLLOUT_WHATIF = "rollout.whatif"

# --- the step's replicas (otel_rollout.replica_load) -----------------------------------------
STEP_ATTR_REPLICAS = "rollout.step.replicas"
"""How many replicas served the step's requests (on steps with two or more)."""
STEP_REPLICA_SPREAD = "rollout.step.replica.spread"
"""Histogram (s), one point per step with two replicas or more: the latest replica's last finish
− the earliest's."""
STEP_ATTR_REPLICA_SPREAD = "rollout.step.replica.spread_s"
