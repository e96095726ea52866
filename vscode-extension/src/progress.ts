// Server work-done progress (`window/workDoneProgress/create` + `$/progress`).
// The language client's built-in handler shows every progress in the status
// bar, where it cannot be cancelled; this one replaces it and shows
// cancellable runs as a notification whose Cancel button
// sends `window/workDoneProgress/cancel`, which the server turns into
// cancelling the run. (The status bar hears of runs from the server's
// `fuselens/analysisStarted`/`analysisFinished` notifications instead.)

import * as vscode from "vscode";
import {
  LanguageClient,
  WorkDoneProgress,
  WorkDoneProgressBegin,
  WorkDoneProgressCancelNotification,
  WorkDoneProgressCreateRequest,
  WorkDoneProgressReport,
} from "vscode-languageclient/node";

export function trackServerProgress(client: LanguageClient): vscode.Disposable {
  return client.onRequest(WorkDoneProgressCreateRequest.type, ({ token }) => {
    let report: ((value: WorkDoneProgressReport) => void) | undefined;
    let finish: (() => void) | undefined;
    const done = new Promise<void>((resolve) => (finish = resolve));
    const subscription = client.onProgress(WorkDoneProgress.type, token, (value) => {
      if (value.kind === "begin") {
        show(value, (r) => (report = r), done, () =>
          client.sendNotification(WorkDoneProgressCancelNotification.type, { token }),
        );
      } else if (value.kind === "report") {
        report?.(value);
      } else if (value.kind === "end") {
        subscription.dispose();
        finish?.();
      }
    });
  });
}

/** Shows one progress in VS Code until `done`; cancellable ones as a notification. */
function show(
  begin: WorkDoneProgressBegin,
  setReport: (r: (value: WorkDoneProgressReport) => void) => void,
  done: Promise<void>,
  cancel: () => void,
): void {
  const location = begin.cancellable ? vscode.ProgressLocation.Notification : vscode.ProgressLocation.Window;
  void vscode.window.withProgress(
    { location, title: begin.title, cancellable: begin.cancellable },
    async (progress, token) => {
      progress.report({ message: begin.message });
      setReport((value) => progress.report({ message: value.message }));
      token.onCancellationRequested(cancel);
      await done;
    },
  );
}
