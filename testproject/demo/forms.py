from django import forms


class SendJobsForm(forms.Form):
    count = forms.IntegerField(label="Jobs to send", min_value=1, max_value=1000, initial=20)
    failing_percent = forms.IntegerField(
        label="% failing",
        min_value=0,
        max_value=100,
        initial=10,
        help_text="Half fail every time (straight to the dead set), half fail at random and are retried.",
    )
    slow_percent = forms.IntegerField(
        label="% slow",
        min_value=0,
        max_value=100,
        initial=10,
        help_text="Sleep 1 to 10 seconds on the low queue.",
    )

    def clean(self) -> dict:
        cleaned = super().clean() or {}
        failing = cleaned.get("failing_percent") or 0
        slow = cleaned.get("slow_percent") or 0
        if failing + slow > 100:
            raise forms.ValidationError("% failing and % slow add up to more than 100.")
        return cleaned
