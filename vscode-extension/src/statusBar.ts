// The status bar item: server state, analysis running, last result.

import * as vscode from "vscode";
import {
  AnalysisFinishedParams,
  AnalysisSummary,
  StatusState,
  statusView,
  summarizeDiagnostics,
  summaryFromAnalyzeAnswer,
  summaryFromNotification,
} from "./logic/status";

export class StatusBar implements vscode.Disposable {
  private readonly item: vscode.StatusBarItem;
  private state: StatusState = { kind: "starting" };
  private readonly disposables: vscode.Disposable[] = [];

  constructor() {
    this.item = vscode.window.createStatusBarItem("fuselens.status", vscode.StatusBarAlignment.Left, 50);
    this.item.name = "FuseLens";
    this.disposables.push(
      this.item,
      vscode.languages.onDidChangeDiagnostics(() => this.refreshFromEditor()),
      vscode.window.onDidChangeActiveTextEditor(() => this.refreshFromEditor()),
    );
    this.render();
    this.item.show();
  }

  set(state: StatusState): void {
    this.state = state;
    this.render();
  }

  /** The server started analysing `uri` (notification or a command we sent). */
  analysisStarted(uri?: string): void {
    this.set({ kind: "running", file: uri ? shortName(uri) : undefined });
  }

  /** The server's `fuselens/analysisFinished` notification. */
  analysisFinished(params: AnalysisFinishedParams): void {
    this.showResult(summaryFromNotification(params), params.uri);
  }

  /** The answer of a `fuselens.analyze` we sent (also when it failed and no notification came). */
  analyzeAnswered(answer: unknown, uri: string): void {
    this.showResult(summaryFromAnalyzeAnswer(answer), uri);
  }

  /** Counts are shown as they are; without them the diagnostics are counted (they keep the item current after). */
  private showResult(summary: AnalysisSummary | undefined, uri: string): void {
    if (summary) {
      this.set({ kind: "result", summary, file: shortName(uri) });
    } else {
      this.refreshFromEditor(true);
    }
  }

  /** Falls back to counting diagnostics of the active document. */
  private refreshFromEditor(force = false): void {
    if (!force && (this.state.kind === "running" || this.state.kind === "restricted" || this.state.kind === "stopped" || this.state.kind === "starting")) {
      return;
    }
    const uri = activeDocumentUri();
    if (!uri) {
      if (force) {
        this.set({ kind: "idle" });
      }
      return;
    }
    const diagnostics = collectDiagnostics(uri);
    const summary = summarizeDiagnostics(diagnostics.map(toDiagnosticLike));
    if (diagnostics.length === 0 && this.state.kind === "idle") {
      return; // nothing analysed yet: keep "ready"
    }
    this.set({ kind: "result", summary, file: shortName(uri.toString()) });
  }

  private render(): void {
    const view = statusView(this.state);
    this.item.text = view.text;
    this.item.tooltip = view.tooltip;
    this.item.backgroundColor = view.severity ? new vscode.ThemeColor(`statusBarItem.${view.severity}Background`) : undefined;
    this.item.command =
      this.state.kind === "result" ? "fuselens.showReport" : this.state.kind === "restricted" ? "workbench.trust.manage" : "fuselens.showOutput";
  }

  dispose(): void {
    for (const d of this.disposables) {
      d.dispose();
    }
  }
}

/** The active text document, or the active notebook's file. */
function activeDocumentUri(): vscode.Uri | undefined {
  const notebook = vscode.window.activeNotebookEditor?.notebook;
  if (notebook) {
    return notebook.uri;
  }
  return vscode.window.activeTextEditor?.document.uri;
}

/** Diagnostics of a file, or of every cell of a notebook. */
function collectDiagnostics(uri: vscode.Uri): vscode.Diagnostic[] {
  const notebook = vscode.workspace.notebookDocuments.find((nb) => nb.uri.toString() === uri.toString());
  if (notebook) {
    return notebook.getCells().flatMap((cell) => vscode.languages.getDiagnostics(cell.document.uri));
  }
  return vscode.languages.getDiagnostics(uri);
}

function toDiagnosticLike(d: vscode.Diagnostic) {
  const code = d.code;
  return {
    source: d.source,
    message: d.message,
    code: typeof code === "object" && code !== null ? { value: code.value } : code,
  };
}

function shortName(uri: string): string {
  const parts = decodeURIComponent(uri).split(/[\\/]/);
  return parts[parts.length - 1] || uri;
}
