"""A rank's life as the hook sees it: install() (installer), which launcher started it
and which rank it is (launcher), the job id its ranks agree on (jobid), and how it
leaves: exit calls (exitcall) and its last words beside the slot."""
