"""tftpu.passes"""
