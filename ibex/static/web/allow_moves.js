/* The order form's "Allow planned moves" follows the tier's default (spot: yes, others: no)
   until the person ticks or unticks it themselves. No inline script: CSP-safe. */
(function () {
  "use strict";

  function wire() {
    var tier = document.getElementById("id_tier");
    var moves = document.getElementById("id_allow_moves");
    if (!tier || !moves || moves.dataset.wired) { return; }
    moves.dataset.wired = "yes";
    moves.addEventListener("change", function () { moves.dataset.chosen = "yes"; });
    tier.addEventListener("change", function () {
      if (!moves.dataset.chosen) { moves.checked = tier.value === "spot"; }
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", wire);
  } else {
    wire();
  }
}());
