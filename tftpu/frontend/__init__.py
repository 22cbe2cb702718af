"""tftpu.frontend"""
