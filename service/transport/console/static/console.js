// The tail page: each server-sent event is a table row of a write that matched the template.
(function () {
  "use strict";
  const rows = document.getElementById("tail-rows");
  const state = document.getElementById("tail-state");
  if (!rows) return;
  const source = new EventSource(rows.dataset.source);
  source.onopen = function () { state.textContent = "tailing: new writes appear below"; };
  source.onmessage = function (event) { rows.insertAdjacentHTML("afterbegin", event.data); };
  source.addEventListener("failed", function (event) {
    state.textContent = "refused: " + event.data;
    state.className = "refused";
    source.close();
  });
  source.onerror = function () { state.textContent = "disconnected; retrying…"; };
})();
