/* The output tail on a lease page: a rank's <pre class="log"> that the reader keeps scrolled
   to its end stays at its end as htmx appends lines (scrolled up, it stays where it is). */
(function () {
  function atEnd(log) { return log.scrollHeight - log.scrollTop - log.clientHeight < 24; }
  function follow() {
    document.querySelectorAll("pre.log[data-follow=yes]").forEach(function (log) {
      log.scrollTop = log.scrollHeight;
    });
  }
  document.addEventListener("htmx:beforeSwap", function (event) {
    var target = event.detail.target, log = target && target.closest && target.closest("pre.log");
    if (log) { log.dataset.follow = atEnd(log) ? "yes" : "no"; }
  });
  document.addEventListener("htmx:afterSettle", follow);
  follow();
})();
