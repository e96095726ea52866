// Server work-done progress (`window/workDoneProgress/create` + `$/progress`),
// shown by VS Code as usual and also reported to the status bar item.
//
// The language client's built-in handler shows the progress but keeps it to
// itself, and a progress token has room for one listener, so this replaces
// that handler with one that does both. Cancelling the VS Code notification
// sends `window/workDoneProgress/cancel`, which the server turns into
// cancelling the run.

import * as vscode from "vscode";
import {
  LanguageClient,
  WorkDoneProgress,
  WorkDoneProgressBegin,
  WorkDoneProgressCancelNotification,
  WorkDoneProgressCreateRequest,
  WorkDoneProgressReport,
} from "vscode-languageclient/node";

export interface ProgressListener {
  begin(message: string | undefined): void;
  end(message: string | undefined): void;
}

export function trackServerProgress(client: LanguageClient, listener: ProgressListener): vscode.Disposable {
  return client.onRequest(WorkDoneProgressCreateRequest.type, ({ token }) => {
    let report: ((value: WorkDoneProgressReport) => void) | undefined;
    let finish: (() => void) | undefined;
    const done = new Promise<void>((resolve) => (finish = resolve));
    const subscription = client.onProgress(WorkDoneProgress.type, token, (value) => {
      if (value.kind === "begin") {
        listener.begin(value.message);
        show(value, (r) => (report = r), done, () =>
          client.sendNotification(WorkDoneProgressCancelNotification.type, { token }),
        );
      } else if (value.kind === "report") {
        report?.(value);
      } else if (value.kind === "end") {
        subscription.dispose();
        listener.end(value.message);
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
