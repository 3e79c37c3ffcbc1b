from django.contrib import admin

from testproject.demo.models import JobResult


@admin.register(JobResult)
class JobResultAdmin(admin.ModelAdmin):
    list_display = ["finished_at", "job", "jid", "status", "detail"]
    list_filter = ["status", "job"]
    search_fields = ["jid", "detail"]
    date_hierarchy = "finished_at"
