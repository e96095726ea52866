// The status bar item's state machine and text. Pure.
//
// Results come from the server's `fuselens/analysisFinished` notification
// when it sends one, otherwise from counting the fuselens diagnostics of the
// active document.

export interface AnalysisSummary {
  graphBreaks: number;
  recompiles: number;
  errors: number;
  /** Seconds the analysis took, when known. */
  seconds?: number;
}

export type StatusState =
  | { kind: "starting" }
  | { kind: "stopped"; reason?: string }
  | { kind: "restricted" }
  | { kind: "idle" }
  | { kind: "running"; file?: string }
  | { kind: "result"; summary: AnalysisSummary; file?: string };

export interface StatusView {
  text: string;
  tooltip: string;
  /** "warning" / "error" background, or none. */
  severity?: "warning" | "error";
}

/** A diagnostic as far as the summary cares. */
export interface DiagnosticLike {
  source?: string;
  code?: string | number | { value: string | number };
  message: string;
}

/** The diagnostic `source` the server stamps on its diagnostics. */
export const DIAGNOSTIC_SOURCE = "fuselens";

/** Counts fuselens graph breaks, recompiles and errors among diagnostics. */
export function summarizeDiagnostics(diagnostics: readonly DiagnosticLike[]): AnalysisSummary {
  const summary: AnalysisSummary = { graphBreaks: 0, recompiles: 0, errors: 0 };
  for (const d of diagnostics) {
    if ((d.source ?? "").toLowerCase() !== DIAGNOSTIC_SOURCE) {
      continue;
    }
    const kind = diagnosticKind(d);
    if (kind === "graph-break") {
      summary.graphBreaks += 1;
    } else if (kind === "recompile") {
      summary.recompiles += 1;
    } else if (kind === "error") {
      summary.errors += 1;
    }
  }
  return summary;
}

/** Classifies a fuselens diagnostic by its code (e.g. "graph-break", "recompile"). */
export function diagnosticKind(d: DiagnosticLike): "graph-break" | "recompile" | "error" | "other" {
  const raw = typeof d.code === "object" && d.code !== null ? d.code.value : d.code;
  const code = String(raw ?? "").toLowerCase();
  if (code.includes("break")) {
    return "graph-break";
  }
  if (code.includes("recompile")) {
    return "recompile";
  }
  if (code.includes("error") || code.includes("timeout") || code.includes("exception")) {
    return "error";
  }
  return "other";
}

/** `fuselens/analysisStarted`: a run of the unit of `uri` began. */
export interface AnalysisStartedParams {
  uri: string;
}

/**
 * `fuselens/analysisFinished` (fuselens/server/notifications.py). The server
 * leaves out fields that are None: a cancelled run has no counts.
 */
export interface AnalysisFinishedParams {
  uri: string;
  status: "ok" | "cancelled";
  cached: boolean;
  version?: number;
  graphBreaks?: number;
  recompiles?: number;
  errors?: number;
  seconds?: number;
}

export const ANALYSIS_STARTED = "fuselens/analysisStarted";
export const ANALYSIS_FINISHED = "fuselens/analysisFinished";

/** The counts of a finished analysis; undefined when it has none (cancelled), so the caller counts diagnostics. */
export function summaryFromNotification(params: AnalysisFinishedParams): AnalysisSummary | undefined {
  if (params.graphBreaks === undefined && params.recompiles === undefined) {
    return undefined;
  }
  return {
    graphBreaks: params.graphBreaks ?? 0,
    recompiles: params.recompiles ?? 0,
    errors: params.errors ?? 0,
    seconds: params.seconds,
  };
}

/**
 * Reads the answer of the `fuselens.analyze` command (`graph_breaks`,
 * `recompiles`, `errors` as a list of kinds, `wall_s`); undefined for an
 * answer without counts (untrusted, cancelled, an error).
 */
export function summaryFromAnalyzeAnswer(answer: unknown): AnalysisSummary | undefined {
  if (!answer || typeof answer !== "object") {
    return undefined;
  }
  const a = answer as { graph_breaks?: unknown; recompiles?: unknown; errors?: unknown; wall_s?: unknown };
  if (typeof a.graph_breaks !== "number" || typeof a.recompiles !== "number") {
    return undefined;
  }
  return {
    graphBreaks: a.graph_breaks,
    recompiles: a.recompiles,
    errors: Array.isArray(a.errors) ? a.errors.length : 0,
    seconds: typeof a.wall_s === "number" ? a.wall_s : undefined,
  };
}

function plural(n: number, one: string, many: string): string {
  return `${n} ${n === 1 ? one : many}`;
}

/** Text, tooltip and colour of the status bar item for a state. */
export function statusView(state: StatusState): StatusView {
  switch (state.kind) {
    case "starting":
      return { text: "$(loading~spin) FuseLens", tooltip: "FuseLens: starting the server" };
    case "stopped":
      return {
        text: "$(circle-slash) FuseLens",
        tooltip: `FuseLens: server stopped${state.reason ? ` (${state.reason})` : ""}. Click to see the log.`,
        severity: state.reason ? "error" : undefined,
      };
    case "restricted":
      return {
        text: "$(shield) FuseLens",
        tooltip: "FuseLens: restricted mode. Trust this folder to let FuseLens run your program.",
      };
    case "idle":
      return { text: "$(flame) FuseLens", tooltip: "FuseLens: ready. Save a Python file or run FuseLens: Analyze File." };
    case "running":
      return {
        text: "$(sync~spin) FuseLens: analysing",
        tooltip: `FuseLens: running ${state.file ?? "the program"} under torch.compile capture`,
      };
    case "result": {
      const s = state.summary;
      const parts = [plural(s.graphBreaks, "break", "breaks"), plural(s.recompiles, "recompile", "recompiles")];
      if (s.errors) {
        parts.push(plural(s.errors, "error", "errors"));
      }
      const took = s.seconds !== undefined ? ` in ${s.seconds.toFixed(1)} s` : "";
      const clean = s.graphBreaks === 0 && s.recompiles === 0 && s.errors === 0;
      return {
        text: `${clean ? "$(check)" : "$(warning)"} FuseLens: ${parts.join(", ")}`,
        tooltip: `FuseLens: last analysis${state.file ? ` of ${state.file}` : ""}${took}: ${parts.join(", ")}. Click for the report.`,
        severity: s.errors ? "error" : clean ? undefined : "warning",
      };
    }
  }
}
